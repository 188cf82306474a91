"""The emulators' pytest plugin is opt-in: installing the package loads it nowhere."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

PROBE = """
import sys

def test_probe(pytestconfig):
    loaded = pytestconfig.pluginmanager.has_plugin("emulators.pytest_plugin")
    assert loaded == ("emulators.pytest_plugin" in sys.modules) == {wanted}
"""


@pytest.mark.parametrize(
    ("args", "wanted"), [((), False), (("-p", "emulators.pytest_plugin"), True)]
)
def test_the_plugin_loads_only_when_asked(
    tmp_path: Path, args: tuple[str, ...], wanted: bool
) -> None:
    """A project of the user's, outside this repository, with the package installed."""
    (tmp_path / "test_probe.py").write_text(PROBE.format(wanted=wanted))
    ran = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args, "test_probe.py"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert ran.returncode == 0, ran.stdout + ran.stderr
