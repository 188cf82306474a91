"""The sandbox-router command, run as a user would (in-process and as a subprocess)."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest

from policies.quota import projected_spend
from router.cli import main


@pytest.fixture
def chain(tmp_path: Path) -> Path:
    path = tmp_path / "chain.yaml"
    path.write_text(
        f"state_url: sqlite:///{tmp_path}/state.db\n"
        "chain:\n"
        "  - name: local\n"
        "    provider: local\n"
        f"    options: {{root: {tmp_path}/sb}}\n"
        "    quota: {sessions: 5, concurrent: 2}\n"
    )
    return path


def test_exec_prints_output_and_returns_the_exit_code(
    chain: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    code = main(["exec", "--config", str(chain), "--", "echo out; echo err >&2; exit 3"])
    captured = capfd.readouterr()
    assert code == 3
    assert captured.out == "out\n"
    assert "err" in captured.err


def test_exec_argv_form(chain: Path, capfd: pytest.CaptureFixture[str]) -> None:
    assert main(["exec", "--config", str(chain), "--", "python3", "-c", "print(6*7)"]) == 0
    assert capfd.readouterr().out == "42\n"


def test_status_json_and_quota_admin(chain: Path, capsys: pytest.CaptureFixture[str]) -> None:
    main(["exec", "--config", str(chain), "--", "true"])
    capsys.readouterr()
    assert main(["status", "--config", str(chain), "--json"]) == 0
    status = json.loads(capsys.readouterr().out)
    [entry] = status["entries"]
    assert entry["used"]["sessions"] == 1
    assert (entry["state"], entry["limits"]["sessions"]) == ("closed", 5)
    assert {"run_code", "files"} <= set(entry["capabilities"])
    assert main(["quota", "set", "local", "sessions", "5", "--config", str(chain)]) == 0
    assert main(["exec", "--config", str(chain), "--", "true"]) == 3  # no provider left
    assert "quota exhausted: sessions 5/5" in capsys.readouterr().err
    assert main(["quota", "reset", "local", "--config", str(chain)]) == 0
    capsys.readouterr()
    assert main(["quota", "show", "local", "--config", str(chain)]) == 0
    assert json.loads(capsys.readouterr().out)["local"]["used"]["sessions"] == 0


def test_quota_set_on_an_unknown_pool_is_a_clear_error(
    chain: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["quota", "set", "nope", "sessions", "5", "--config", str(chain)]) == 2
    err = capsys.readouterr().err
    assert "no pool 'nope' in this config (pools: local)" in err
    assert "Traceback" not in err


def test_quota_set_concurrent_frees_stuck_slots(
    chain: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from router import Router

    def live() -> float:
        assert main(["quota", "show", "local", "--config", str(chain)]) == 0
        used: float = json.loads(capsys.readouterr().out)["local"]["used"]["concurrent"]
        return used

    with Router.from_config(chain, hooks=[]) as app:  # an app whose leases stay held
        first, second = app.acquire(), app.acquire()
        assert live() == 2
        assert main(["quota", "set", "local", "concurrent", "1", "--config", str(chain)]) == 0
        assert "freed 1 of 2 concurrency slot(s)" in capsys.readouterr().out
        assert live() == 1
        assert main(["quota", "set", "local", "concurrent", "3", "--config", str(chain)]) == 2
        assert "can only lower" in capsys.readouterr().err
        assert main(["quota", "set", "local", "concurrent", "0", "--config", str(chain)]) == 0
        assert "freed 1 of 1 concurrency slot(s)" in capsys.readouterr().out
        assert live() == 0
        first.release()
        second.release()


def test_janitor(chain: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["janitor", "--config", str(chain), "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {"killed": [], "kept": 0, "skipped": {}}


def test_status_table(chain: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["status", "--config", str(chain)]) == 0
    out = capsys.readouterr().out
    assert "local" in out
    matrix = out[out.index("capabilities") :]
    rows = {line.split()[1]: line.split()[3] for line in matrix.splitlines() if "run_code" in line}
    assert rows["run_code"] == "yes"


def test_config_check(chain: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["config", "check", str(chain)]) == 0
    assert "OK" in capsys.readouterr().out
    bad = tmp_path / "bad.yaml"
    bad.write_text("chain:\n  - {name: x, provider: local, quota: {concurrent: -1}}\n")
    assert main(["config", "check", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "chain[0].quota.concurrent" in err
    assert str(bad) in err.replace("\n", "")


def test_console_script_is_installed(chain: Path) -> None:
    exe = Path(sys.executable).parent / "sandbox-router"
    result = subprocess.run(
        [str(exe), "exec", "--config", str(chain), "--", "echo", "installed"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert (result.returncode, result.stdout) == (0, "installed\n")


def test_metrics_sidecar_serves_the_fleet_state(chain: Path) -> None:
    import socket
    import urllib.request

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    exe = Path(sys.executable).parent / "sandbox-router"
    proc = subprocess.Popen(
        [str(exe), "metrics", "--config", str(chain), "--port", str(port)],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        assert "serving http://127.0.0.1" in proc.stdout.readline()
        body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read()
        text = body.decode()
        assert 'sandbox_router_quota_limit{pool="local",unit="sessions"} 5.0' in text
    finally:
        proc.terminate()
        assert proc.wait(10) == 0


def test_emulate_serves_an_emulator_and_its_control_api() -> None:
    import json as json_module
    import socket
    import urllib.request

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    exe = Path(sys.executable).parent / "sandbox-router"
    proc = subprocess.Popen(
        [str(exe), "emulate", "e2b", "--port", str(port)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert f"e2b emulator on http://127.0.0.1:{port}" in line
        control = line.rsplit("control API ", 1)[1].rstrip(")\n")
        health = json_module.loads(urllib.request.urlopen(f"{control}/health", timeout=10).read())
        assert health == {"emulator": "e2b", "url": f"http://127.0.0.1:{port}"}
    finally:
        proc.terminate()
        assert proc.wait(20) == 0


def test_mcp_without_the_sdk_says_what_to_install(chain: Path) -> None:
    """The CLI works without the optional mcp extra; its `mcp` command names the install."""
    hidden = "import sys; sys.modules['mcp'] = None; from router.cli import main; "
    ran = subprocess.run(
        [sys.executable, "-c", hidden + f"sys.exit(main(['mcp', '--config', {str(chain)!r}]))"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert ran.returncode == 2
    assert 'pip install "sandbox-router[mcp]"' in " ".join(ran.stderr.split())
    assert "Traceback" not in ran.stderr


def test_cost_shows_the_window_spend_by_entry_and_pool(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "money.yaml"
    path.write_text(
        f"state_url: sqlite:///{tmp_path}/state.db\n"
        "strategy: cheapest\n"
        "pools: {shared: {sessions: 10}}\n"
        "chain:\n"
        "  - name: dear\n"
        "    provider: local\n"
        "    quota_pool: shared\n"
        f"    options: {{root: {tmp_path}/a}}\n"
        "    price: {vcpu_hour: 2.0, per_sandbox: 0.5}\n"
        "  - name: cheap\n"
        "    provider: local\n"
        "    quota_pool: shared\n"
        f"    options: {{root: {tmp_path}/b}}\n"
        "    resources: {vcpu: 4, memory_gib: 8}\n"
        "    price: {vcpu_hour: 0.1, per_sandbox: 0.01}\n"
        "  - name: rl\n"
        "    provider: runloop\n"
    )
    for _ in range(2):
        assert main(["exec", "--config", str(path), "--", "true"]) == 0
    assert "on cheap" in capsys.readouterr().err  # cheapest served both
    assert main(["cost", "--config", str(path), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    dear, cheap, rl = report["entries"]
    assert cheap["sessions"] == 2
    assert cheap["sandbox_seconds"] > 0
    assert cheap["hourly_usd"] == pytest.approx(0.4)
    assert cheap["spend_usd"] == pytest.approx(cheap["sandbox_seconds"] * 0.4 / 3600 + 0.02)
    assert dear["spend_usd"] == pytest.approx(dear["sandbox_seconds"] * 2.0 / 3600 + 1.0)
    assert (rl["price"], rl["spend_usd"]) == (None, 0.0)
    shared, rl_pool = report["pools"]
    assert shared == {
        "pool": "shared",
        "entries": ["dear", "cheap"],
        "spend_usd": dear["spend_usd"],
        "upper_bound": True,
    }
    assert report["total_usd"] == pytest.approx(dear["spend_usd"] + rl_pool["spend_usd"])
    assert main(["cost", "--config", str(path)]) == 0
    text = capsys.readouterr().out
    assert "unpriced" in text
    assert "(at most)" in text
    assert "total: $1.00" in text


def test_exec_tenant_is_limited_and_cost_tenants_shows_the_top_spenders(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "tenants.yaml"
    path.write_text(
        f"state_url: sqlite:///{tmp_path}/state.db\n"
        "tenants: {default: {sessions: 2}, overrides: {big: {sessions: 3}}}\n"
        "chain:\n"
        "  - name: local\n"
        "    provider: local\n"
        f"    options: {{root: {tmp_path}/sb}}\n"
        "    price: {vcpu_hour: 1.0, per_sandbox: 0.5}\n"
    )
    for tenant, times in (("big", 3), ("small", 1)):
        for _ in range(times):
            assert main(["exec", "--config", str(path), "--tenant", tenant, "--", "true"]) == 0
    capfd.readouterr()
    assert main(["exec", "--config", str(path), "--tenant", "big", "--", "true"]) == 3
    assert "tenant 'big' limit reached: sessions 3/3 until" in capfd.readouterr().err
    assert main(["exec", "--config", str(path), "--tenant", "a b", "--", "true"]) != 0
    assert "acquire(tenant='a b')" in capfd.readouterr().err
    assert main(["cost", "--tenants", "--json", "--config", str(path)]) == 0
    top = json.loads(capfd.readouterr().out)["tenants"]
    assert [(t["tenant"], t["sessions"], t["concurrent"]) for t in top] == [
        ("big", 3, 0), ("small", 1, 0),
    ]  # fmt: skip
    assert top[0]["usd"] == pytest.approx(1.5, abs=0.01)  # 3 fees and a few seconds
    assert main(["cost", "--tenants", "--top", "1", "--config", str(path)]) == 0
    text = capfd.readouterr().out
    assert "big" in text
    assert "small" not in text
    assert "$1.50" in text
    assert main(["cost", "--tenants", "--top", "0", "--config", str(path)]) == 2


def test_cost_month_shows_each_pools_month_budget_left_and_projection(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "month.yaml"
    path.write_text(
        f"state_url: sqlite:///{tmp_path}/state.db\n"
        "pools: {team: {usd: 5, budget_window: 60}}\n"
        "chain:\n"
        "  - name: local\n"
        "    provider: local\n"
        "    quota_pool: team\n"
        f"    options: {{root: {tmp_path}/a}}\n"
        "    price: {vcpu_hour: 3.6, per_sandbox: 0.5}\n"
        "  - name: free\n"
        "    provider: local\n"
        f"    options: {{root: {tmp_path}/b}}\n"
    )
    for _ in range(2):
        assert main(["exec", "--config", str(path), "--", "true"]) == 0
    capsys.readouterr()
    assert main(["cost", "--month", "--config", str(path), "--json"]) == 0
    now = datetime.now(UTC).timestamp()
    report = json.loads(capsys.readouterr().out)
    team, free = report["pools"]
    assert (team["pool"], team["entries"], team["budget_usd"]) == ("team", ["local"], 5)
    # two sandbox fees and the seconds at 1 vCPU x $3.60 an hour, as each lease settled
    seconds = report["entries"][0]["sandbox_seconds"]
    assert team["spent_usd"] == pytest.approx(1.0 + seconds * 0.001, abs=0.002)
    assert team["held_usd"] == 0
    assert team["left_usd"] == pytest.approx(5 - team["spent_usd"])
    start = datetime.fromisoformat(team["window_start"]).timestamp()
    reset = datetime.fromisoformat(team["reset_at"]).timestamp()
    expected = projected_spend(team["spent_usd"], start, reset, now)
    assert team["projected_usd"] == pytest.approx(expected, rel=1e-3)
    assert team["over_budget"] is (expected > 5)
    assert (free["spent_usd"], free["budget_usd"], free["left_usd"]) == (0, None, None)
    assert (free["projected_usd"], free["over_budget"]) == (0, False)
    assert report["total_usd"] == team["spent_usd"]
    assert report["projected_usd"] == pytest.approx(team["projected_usd"])

    assert main(["cost", "--month", "--config", str(path)]) == 0
    text = capsys.readouterr().out
    assert "spend this month, by pool" in text
    assert f"${team['left_usd']:.2f}" in text
    assert f"total: ${team['spent_usd']:.2f} spent" in text
    assert main(["cost", "--config", str(path)]) == 0  # without --month: as before
    assert "spend this window, by entry (estimated)" in capsys.readouterr().out


@pytest.mark.parametrize(
    "args",
    [
        ["metrics", "--port", "70000"],
        ["mcp", "--http", "--port", "-1"],
        ["emulate", "e2b", "--port", "65536"],
        ["emulate", "e2b", "--control-port", "-2"],
        ["demo", "--metrics-port", "99999"],
    ],
)
def test_a_port_out_of_range_is_a_usage_error(
    args: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """Refused by the parser, naming the option, before anything starts or binds."""
    with pytest.raises(SystemExit) as exited:
        main(args)
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {args[-2]}" in err
    assert "0 to 65535" in err
