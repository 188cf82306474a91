"""``sandbox-router demo``: a scripted day of traffic through the default chain.

No cloud keys and no Redis needed: the four provider emulators start on
loopback, the real adapters (and vendor SDKs) talk to them, and the chain
daytona -> runloop -> modal -> e2b -> local runs on the embedded SQLite
store (or ``--redis URL``) with small monthly quotas. Midway the script
takes Daytona down, sends Runloop a 429 storm and runs Modal's quota out;
the traffic flows down the chain and comes back to Daytona once its
breaker closes. Every request runs a real command in a real sandbox.
"""

from __future__ import annotations

import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console, Group
from rich.live import Live
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn
from rich.table import Table

from emulators import sdk_environment
from router.config import DEFAULT_CHAIN
from router.core import Router
from router.events import Event, Hook, log_hook

if TYPE_CHECKING:
    from emulators.harness import Emulator

__all__ = ["DemoSummary", "run_demo"]


@dataclass
class Phase:
    """A stretch of the day: what happens to the providers, then N requests."""

    name: str
    requests: int
    before: Callable[[dict[str, Emulator]], None] = lambda emus: None
    pause: float = 0.0


@dataclass
class DemoSummary:
    requests: int = 0
    served: Counter[str] = field(default_factory=Counter)
    failed: int = 0
    errors: list[str] = field(default_factory=list)
    failovers: Counter[str] = field(default_factory=Counter)  # "from->to:reason"
    failovers_by_phase: dict[str, dict[str, int]] = field(default_factory=dict)
    served_by_phase: dict[str, dict[str, int]] = field(default_factory=dict)
    quota: dict[str, dict[str, float | None]] = field(default_factory=dict)
    alive_in_emulators: dict[str, int] = field(default_factory=dict)
    created_in_emulators: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["served"] = dict(self.served)
        data["failovers"] = dict(self.failovers)
        return data


def _outage(name: str) -> Callable[[dict[str, Emulator]], None]:
    def inject(emus: dict[str, Emulator]) -> None:
        emus[name].inject("create", status=503, times=None, message="service unavailable")

    return inject


def _storm(name: str) -> Callable[[dict[str, Emulator]], None]:
    def inject(emus: dict[str, Emulator]) -> None:
        emus[name].inject("create", status=429, retry_after=30, times=None,
                          message="rate limit exceeded")  # fmt: skip

    return inject


def _recover(emus: dict[str, Emulator]) -> None:
    for emu in emus.values():
        emu.clear_faults()


def roles(names: list[str]) -> dict[str, str]:
    """Who goes down, who gets the 429 storm, whose quota runs out (in chain order)."""
    return dict(zip(("outage", "storm", "spent"), names, strict=False))


def quotas(names: list[str]) -> dict[str, int]:
    """Small monthly session quotas; the third entry's is the one that runs out."""
    spent = roles(names).get("spent")
    return {name: (8 if name == spent else 40) for name in names}


def script(names: list[str], scale: int = 1) -> list[Phase]:
    role = roles(names)
    down, storm, spent = role.get("outage"), role.get("storm"), role.get("spent")
    day = [Phase("morning: all healthy", 8 * scale)]
    if down:
        day.append(Phase(f"{down} outage (503s)", 8 * scale, _outage(down)))
    if storm:
        title = f"{storm} 429 storm" + (f", {spent}'s quota runs out" if spent else "")
        day.append(Phase(title, 14 * scale, _storm(storm)))
    day.append(Phase(f"recovery: {down or 'the'} breaker closes", 10 * scale, _recover, pause=3.5))
    return day


@contextmanager
def _emulators(stack: ExitStack) -> Iterator[dict[str, Emulator]]:
    from emulators import available, emulator_class

    names = available(list(DEFAULT_CHAIN))
    emus = {name: stack.enter_context(emulator_class(name)()) for name in names}
    yield emus


def _config(state_url: str, root: Path, names: list[str]) -> dict[str, Any]:
    chain: list[dict[str, Any]] = [
        {"name": name, "provider": name, "quota": {"sessions": limit}}
        for name, limit in quotas(names).items()
    ]
    chain.append({"name": "local", "provider": "local", "options": {"root": str(root)}})
    return {
        "state_url": state_url,
        "key_prefix": "demo",
        "acquire_timeout": 60,
        "create_timeout": 20,
        "retry": {"attempts": 2, "initial": 0.05, "maximum": 0.2},
        "breaker": {"failure_threshold": 2, "cooldown_base": 1, "cooldown_max": 3},
        "chain": chain,
    }


def _view(router: Router, summary: DemoSummary, progress: Progress, phase: str) -> Group:
    table = Table(title=f"phase: {phase}")
    for column in ("entry", "state", "quota used/limit", "served", "failed over"):
        table.add_column(column)
    failed_from = Counter[str]()
    for key, count in summary.failovers.items():
        failed_from[key.split("->")[0]] += count
    for view in router.status().entries:
        limit = view.limits["sessions"]
        used = f"{view.used['sessions']:.0f}/{limit:.0f}" if limit is not None else "-"
        color = "green" if view.state == "closed" else "red"
        table.add_row(view.name, f"[{color}]{view.state}[/{color}]", used,
                      str(summary.served[view.name]), str(failed_from[view.name]))  # fmt: skip
    return Group(progress, table)


def _request(router: Router, phase: str, summary: DemoSummary, events: list[Event]) -> None:
    """One request of the day: acquire, run a real command, release; count what happened."""
    summary.requests += 1
    served = summary.served_by_phase.setdefault(phase, {})
    failed_over = summary.failovers_by_phase.setdefault(phase, {})
    try:
        with router.acquire(timeout=60) as lease:
            result = lease.sandbox.run("echo served", timeout=30)
    except Exception as exc:  # the summary counts it; the demo goes on
        summary.failed += 1
        summary.errors.append(f"{phase}: {type(exc).__name__}: {exc}")
    else:
        if result.stdout.strip() != "served":
            summary.failed += 1
            summary.errors.append(f"{phase}: {lease.entry} printed {result.stdout!r}")
        summary.served[lease.entry] += 1
        served[lease.entry] = served.get(lease.entry, 0) + 1
    for e in events:
        if e.name == "failover":
            source = str(e.fields["from_entry"])
            summary.failovers[f"{source}->{e.fields['to_entry']}:{e.fields['reason']}"] += 1
            failed_over[source] = failed_over.get(source, 0) + 1


def run_demo(
    *,
    redis_url: str | None = None,
    console: Console | None = None,
    live: bool = True,
    scale: int = 1,
    metrics_port: int | None = None,
) -> DemoSummary:
    """Run the scripted day; returns what happened (also printed by the CLI)."""
    console = console or Console(stderr=True)
    summary = DemoSummary()
    started = time.monotonic()
    with ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="sr-demo-")))
        emus = stack.enter_context(_emulators(stack))
        phases = script(list(emus), scale)
        stack.enter_context(sdk_environment(*emus.values()))
        state_url = redis_url or f"sqlite:///{tmp}/state.db"
        events: list[Event] = []
        hooks: list[Hook] = [events.append]
        if not live:
            hooks.append(log_hook)
        router = stack.enter_context(
            Router.from_config(_config(state_url, tmp, list(emus)), hooks=hooks)
        )
        if metrics_port is not None:
            from router.metrics import serve

            server = serve(router, metrics_port)
            stack.callback(server.server_close)
            stack.callback(server.shutdown)
        progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn())
        task = progress.add_task("requests", total=sum(p.requests for p in phases))
        display = Live(console=console, refresh_per_second=8, transient=False) if live else None
        if display is not None:
            stack.enter_context(display)
        for phase in phases:
            phase.before(emus)
            time.sleep(phase.pause)
            for _ in range(phase.requests):
                events.clear()
                _request(router, phase.name, summary, events)
                progress.advance(task)
                if display is not None:
                    display.update(_view(router, summary, progress, phase.name))
        _recover(emus)
        for view in router.status().entries:
            summary.quota[view.name] = {
                "used": view.used["sessions"],
                "limit": view.limits["sessions"],
            }
        for name, emu in emus.items():
            summary.alive_in_emulators[name] = len(emu.alive())
            summary.created_in_emulators[name] = len(emu.records())
    summary.seconds = round(time.monotonic() - started, 1)
    return summary


def summary_table(summary: DemoSummary) -> Table:
    table = Table(title=f"demo: {summary.requests} requests in {summary.seconds}s, "
                  f"{summary.failed} failed")  # fmt: skip
    for column in ("entry", "served", "quota used/limit", "alive in emulator"):
        table.add_column(column)
    for name, quota in summary.quota.items():
        limit = quota["limit"]
        table.add_row(
            name,
            str(summary.served[name]),
            f"{quota['used']:.0f}/{limit:.0f}" if limit is not None else f"{quota['used']:.0f}/-",
            str(summary.alive_in_emulators.get(name, "-")),
        )
    return table
