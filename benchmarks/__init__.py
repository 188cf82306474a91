"""Benchmarks: ``python -m benchmarks`` prints one JSON summary on stdout.

Every figure is measured within one run, as a ratio or a difference against
a baseline taken in the same run (this machine is noisy), with medians over
repeats and the raw numbers kept in the JSON. See RESULTS.md.
"""
