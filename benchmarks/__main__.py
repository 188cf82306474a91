"""``python -m benchmarks [--quick] [suite ...]``: see `benchmarks.suites`."""

if __name__ == "__main__":
    import sys

    from benchmarks.suites import main

    sys.exit(main())
