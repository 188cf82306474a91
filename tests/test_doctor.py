"""``sandbox-router doctor`` against the emulators: real SDK calls, real cycles."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from emulators.harness import Emulator
from router import Router
from router.cli import main
from tests.providers.test_failover import NAMES, VENDORS


def write_chain(tmp_path: Path, redis_url: str, key_prefix: str, *entries: Any) -> Path:
    path = tmp_path / "chain.yaml"
    local = {"name": "local", "provider": "local", "options": {"root": str(tmp_path / "sb")}}
    config = {"state_url": redis_url, "key_prefix": key_prefix, "chain": [*entries, local]}
    path.write_text(yaml.safe_dump(config))
    return path


def doctor(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict[str, Any]]:
    code = main(["doctor", "--json", *args])
    return code, {c["entry"]: c for c in json.loads(capsys.readouterr().out)}


@pytest.mark.parametrize("vendor", NAMES)
def test_a_create_run_kill_cycle_on_each_emulator(
    vendor: str,
    request: pytest.FixtureRequest,
    tmp_path: Path,
    redis_url: str,
    key_prefix: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    emu: Emulator = request.getfixturevalue(f"{vendor}_emulator")
    entry = {"name": vendor, "provider": vendor, "quota": {"sessions": 5},
             "options": VENDORS[vendor].options(emu)}  # fmt: skip
    chain = write_chain(tmp_path, redis_url, key_prefix, entry)
    code, checks = doctor(capsys, "--config", str(chain), "--create", vendor)
    assert code == 0, {
        name: (c["credentials"], c["cycle"], c["problems"]) for name, c in checks.items()
    }
    found = checks[vendor]
    assert (found["credentials"], found["cycle"], found["problems"]) == ("ok", "ok", [])
    assert set(found["seconds"]) == {"credentials", "create", "run", "kill"}
    assert found["quota_left"] == {"sessions": 4}
    assert emu.alive() == []
    assert len(emu.records()) == 1
    assert checks["local"]["cycle"] == "skipped"  # opt-in: no session spent there
    with Router.from_config(chain, hooks=[]) as router:  # the ledger counted it
        view = next(v for v in router.status().entries if v.name == vendor)
    assert view.used["sessions"] == 1


def test_refused_credentials_and_missing_ones_are_reported(
    e2b_emulator: Emulator,
    tmp_path: Path,
    redis_url: str,
    key_prefix: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("E2B_API_KEY", raising=False)
    options = VENDORS["e2b"].options(e2b_emulator)
    e2b_emulator.core.accepted_keys = {options["api_key"]}
    wrong = {**options, "api_key": "e2b_" + "0" * 40}
    no_key = {k: v for k, v in options.items() if k != "api_key"}
    chain = write_chain(
        tmp_path, redis_url, key_prefix,
        {"name": "good", "provider": "e2b", "options": options},
        {"name": "wrong", "provider": "e2b", "options": wrong},
        {"name": "nokey", "provider": "e2b", "options": no_key},
    )  # fmt: skip
    code, checks = doctor(capsys, "--config", str(chain), "--create-all")
    assert code == 1
    assert checks["wrong"]["credentials"] == "refused"
    assert checks["wrong"]["cycle"] == "skipped"  # no create with refused credentials
    assert "credentials refused" in checks["wrong"]["problems"][0]
    assert "0000000000" not in json.dumps(checks)
    assert checks["nokey"]["credentials"] == "missing"
    assert "E2B_API_KEY" in checks["nokey"]["problems"][0]
    assert (checks["good"]["cycle"], checks["local"]["cycle"]) == ("ok", "ok")
    assert e2b_emulator.alive() == []


def test_a_failed_cycle_and_the_table(
    e2b_emulator: Emulator,
    tmp_path: Path,
    redis_url: str,
    key_prefix: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    options = VENDORS["e2b"].options(e2b_emulator)
    e2b_emulator.set_quota(max_concurrent=0)  # the provider refuses every create
    entry = {"name": "e2b", "provider": "e2b", "options": options}
    chain = write_chain(tmp_path, redis_url, key_prefix, entry)
    code, checks = doctor(capsys, "--config", str(chain), "--create", "e2b", "--timeout", "10")
    assert code == 1
    assert checks["e2b"]["cycle"] == "failed"
    assert checks["e2b"]["problems"][0].startswith("create: NoProviderAvailable")
    assert main(["doctor", "--config", str(chain)]) == 0  # nothing asked to run: all fine
    table = capsys.readouterr().out
    assert "e2b" in table
    assert "local" in table
    assert "skipped" in table


def test_create_names_an_unknown_entry(
    tmp_path: Path, redis_url: str, key_prefix: str, capsys: pytest.CaptureFixture[str]
) -> None:
    chain = write_chain(tmp_path, redis_url, key_prefix)
    assert main(["doctor", "--config", str(chain), "--create", "nope"]) == 2
    assert "no entry nope in this config (entries: ['local'])" in capsys.readouterr().err
