"""The ``sandbox-router`` command.

    sandbox-router exec [--config FILE] [--tenant T] -- CMD...  acquire, run, print, release
    sandbox-router status [--config FILE] [--json]  health and quota per entry
    sandbox-router cost [--config FILE] [--json]    this window's spend by entry and pool
    sandbox-router cost --tenants [--top N] [--json]  the top spending tenants
    sandbox-router cost --month [--json]            ... budget left, projected month-end
    sandbox-router config check FILE                validate a chain file
    sandbox-router doctor [--create ENTRY|--create-all] [--json]  prove each entry works
    sandbox-router quota show|set|reset POOL [UNIT VALUE]   (UNIT: sessions,
                                                    sandbox_seconds, concurrent)
    sandbox-router janitor [--config FILE]           kill orphaned sandboxes
    sandbox-router demo [--json] [--redis URL]      a scripted day on the emulators
    sandbox-router metrics [--config FILE] [--port N]  serve Prometheus /metrics
    sandbox-router mcp [--config FILE] [--http [--host H] [--port N]]  an MCP server
    sandbox-router emulate daytona|runloop|modal|e2b|all [--port N]

Without ``--config`` the router comes from the environment (see
`router.config.from_env`). Logs go to stderr, readable on a terminal and
JSON lines elsewhere (``--log-format`` or the config's ``log.format`` choose);
the command's own output goes to stdout. The CLI configures logging; the
library never does.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict
from datetime import datetime
from typing import TYPE_CHECKING, Any, get_args

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from policies.quota import UNITS
from providers.capabilities import Capability
from providers.errors import ConfigError, NoProviderAvailable, SandboxRouterError
from router import config as config_mod
from router.core import EntryView, Router, RouterStatus
from router.logs import LogFormat, configure_logging
from router.spend import month_report, spend_report
from router.state import EntryRef, open_store

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

__all__ = ["main", "run_exporter"]

# Tables stay readable when piped (rich would otherwise assume 80 columns).
out = Console(width=None if sys.stdout.isatty() else 140)
err = Console(stderr=True)


def _router(args: argparse.Namespace) -> Router:
    cfg = config_mod.load_config(args.config) if args.config else config_mod.from_env()
    if cfg.log.model_fields_set:
        _configure_logging(args, cfg.log.format, cfg.log.level)
    return Router(cfg)


def _configure_logging(
    args: argparse.Namespace, fmt: LogFormat = "auto", level: str = "warning"
) -> None:
    """The command's logs: ``--log-format``, else the config's ``log.format``, else
    readable on a terminal and JSON lines off one; warnings, the config's
    ``log.level``, and at least info (routing events) with ``-v``."""
    if args.verbose and logging.getLevelNamesMapping()[level.upper()] > logging.INFO:
        level = "info"
    configure_logging(args.log_format or fmt, level)


def cmd_exec(args: argparse.Namespace) -> int:
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        err.print("[red]exec: give a command after --, e.g. sandbox-router exec -- echo hi[/red]")
        return 2
    with _router(args) as router:
        lease = router.acquire(requires=args.requires, timeout=args.timeout, tenant=args.tenant)
        with lease:
            err.print(f"[dim]sandbox {lease.sandbox_id} on {lease.entry}[/dim]")
            shell = command[0] if len(command) == 1 else None
            result = lease.sandbox.run(shell or command, timeout=args.command_timeout)
        sys.stdout.write(result.stdout)
        sys.stderr.write(result.stderr)
        if result.timed_out:
            err.print(f"[red]timed out after {args.command_timeout}s[/red]")
            return 124
        return result.exit_code


def _when(value: datetime | None) -> str:
    return value.strftime("%Y-%m-%d %H:%M UTC") if value else "-"


def _usage(view: EntryView, unit: str) -> str:
    used, limit = view.used[unit], view.limits[unit]
    shown = f"{used:.0f}" if unit != "sandbox_seconds" else f"{used / 3600:.1f}h"
    if limit is None:
        return f"{shown} / -"
    cap = f"{limit:.0f}" if unit != "sandbox_seconds" else f"{limit / 3600:.1f}h"
    return f"{shown} / {cap}"


def _status_json(status: RouterStatus) -> dict[str, Any]:
    return {
        "state_url": status.state_url,
        "state_ok": status.state_ok,
        "state_error": status.state_error,
        "on_state_error": status.on_state_error,
        "entries": [
            {
                "name": v.name,
                "provider": v.provider,
                "pool": v.pool,
                "configured": v.configured,
                "unconfigured_reason": v.unconfigured_reason,
                "state": v.state,
                "until": v.until.isoformat() if v.until else None,
                "detail": v.detail,
                "used": v.used,
                "limits": v.limits,
                "window_start": v.window_start.isoformat(),
                "reset_at": v.reset_at.isoformat(),
                "exhausted_at": {u: t.isoformat() for u, t in v.exhausted_at.items()},
                "live_leases": v.live_leases,
                "capabilities": sorted(v.capabilities),
                "price": None if v.price is None else _price_json(v),
                "price_source": v.price_source,
                "spend_usd": v.spend_usd,
                "hourly_usd": v.hourly_usd,
                "usd_held": v.usd_held,
                "usd_projected": v.usd_projected,
            }
            for v in status.entries
        ],
    }


def _price_json(view: EntryView) -> dict[str, Any]:
    price = view.price
    assert price is not None
    return {**asdict(price), "gpu_hour": dict(price.gpu_hour)}


def _spend(view: EntryView) -> str:
    return "unpriced" if view.price is None else f"${view.spend_usd:.2f}"


def _budget(view: EntryView) -> str:
    """The pool's usd budget: settled spend, what live leases hold, the limit."""
    limit = view.limits["usd"]
    if limit is None:
        return "-"
    return f"${view.used['usd']:.2f} + ${view.usd_held:.2f} held / ${limit:.2f}"


def _capability_matrix(status: RouterStatus) -> Table:
    """Which entry can do what: the capabilities `acquire(requires=...)` routes by."""
    table = Table(title="capabilities")
    table.add_column("capability")
    for v in status.entries:
        table.add_column(v.name)
    known = [str(c) for c in Capability]
    extra = sorted({c for v in status.entries for c in v.capabilities} - set(known))
    for cap in [*known, *extra]:
        table.add_row(cap, *("yes" if cap in v.capabilities else "-" for v in status.entries))
    return table


def cmd_status(args: argparse.Namespace) -> int:
    with _router(args) as router:
        status = router.status()
    if args.json:
        out.print_json(json.dumps(_status_json(status)))
        return 0
    table = Table(title=f"sandbox-router: {status.state_url}")
    for column in ("entry", "provider", "state", "sessions", "sandbox time", "concurrent",
                   "spend", "usd budget", "resets", "runs out at this rate"):  # fmt: skip
        table.add_column(column)
    notes = []
    for v in status.entries:
        state = v.state if not v.until else f"{v.state} until {_when(v.until)}"
        if not v.configured:
            state = "[yellow]unconfigured[/yellow]"
            notes.append(f"{v.name}: {v.unconfigured_reason}")
        elif v.state not in ("closed",):
            state = f"[red]{state}[/red]"
        else:
            state = f"[green]{state}[/green]"
        projected = ", ".join(f"{u}: {_when(t)}" for u, t in v.exhausted_at.items()
                              if t < v.reset_at) or "-"  # fmt: skip
        table.add_row(
            v.name, v.provider, state, _usage(v, "sessions"), _usage(v, "sandbox_seconds"),
            f"{v.live_leases} / {v.limits['concurrent'] or '-'}", _spend(v), _budget(v),
            _when(v.reset_at), projected,
        )  # fmt: skip
        if v.price is None:
            notes.append(f"{v.name}: {v.price_source}")
    out.print(table)
    out.print(_capability_matrix(status))
    for note in notes:
        out.print(escape(note), highlight=False)
    if not status.state_ok:
        err.print(f"[red]state store unavailable ({status.on_state_error}): "
                  f"{escape(status.state_error or '')}[/red]")  # fmt: skip
    return 0


def cmd_cost(args: argparse.Namespace) -> int:
    if args.tenants:
        return _cost_tenants(args)
    if args.month:
        return _cost_month(args)
    with _router(args) as router:
        report = spend_report(router.status())
    if args.json:
        out.print_json(json.dumps(report))
        return 0
    by_entry = Table(title="spend this window, by entry (estimated)")
    for column in ("entry", "provider", "pool", "sandbox time", "sessions", "spend", "per hour",
                   "price from"):  # fmt: skip
        by_entry.add_column(column)
    for row in report["entries"]:
        by_entry.add_row(
            row["entry"], row["provider"], row["pool"], f"{row['sandbox_seconds'] / 3600:.2f}h",
            f"{row['sessions']:.0f}",
            "unpriced" if row["price"] is None else f"${row['spend_usd']:.2f}",
            f"${row['hourly_usd']:.4f}", row["price_source"],
        )  # fmt: skip
    out.print(by_entry)
    by_pool = Table(title="spend this window, by pool (estimated)")
    for column in ("pool", "entries", "spend"):
        by_pool.add_column(column)
    for pool in report["pools"]:
        bound = " (at most)" if pool["upper_bound"] else ""
        by_pool.add_row(
            pool["pool"], ", ".join(pool["entries"]), f"${pool['spend_usd']:.2f}{bound}"
        )
    out.print(by_pool)
    out.print(f"total: ${report['total_usd']:.2f}", highlight=False)
    if not report["state_ok"]:
        err.print("[red]state store unavailable: the spend shown is this replica's share[/red]")
    return 0


def _cost_tenants(args: argparse.Namespace) -> int:
    """``cost --tenants``: the top spenders of their current window (`Router.tenants`)."""
    if args.top < 1:
        err.print(f"[red]cost --top: expected a count of at least 1, got {args.top}[/red]")
        return 2
    with _router(args) as router:
        top = router.tenants(args.top)
    if args.json:
        out.print_json(json.dumps({"tenants": [asdict(t) for t in top]}))
        return 0
    table = Table(title=f"top {args.top} tenants by spend, this window")
    for column in ("tenant", "window", "spend", "held", "sessions", "live leases"):
        table.add_column(column)
    for t in top:
        table.add_row(
            escape(t.tenant), t.window, f"${t.usd:.2f}", f"${t.usd_held:.2f}", str(t.sessions),
            str(t.concurrent),
        )  # fmt: skip
    out.print(table)
    return 0


def _cost_month(args: argparse.Namespace) -> int:
    """``cost --month``: each pool's month from its ledger, budget left, the month-end."""
    with _router(args) as router:
        report = month_report(router.status())
    if args.json:
        out.print_json(json.dumps(report))
        return 0
    by_entry = Table(title="spend this month, by entry (estimated)")
    for column in ("entry", "pool", "sandbox time", "sessions", "spend"):
        by_entry.add_column(column)
    for row in report["entries"]:
        by_entry.add_row(
            row["entry"], row["pool"], f"{row['sandbox_seconds'] / 3600:.2f}h",
            f"{row['sessions']:.0f}",
            "unpriced" if row["price"] is None else f"${row['spend_usd']:.2f}",
        )  # fmt: skip
    out.print(by_entry)
    by_pool = Table(title="spend this month, by pool (the ledger's)")
    for column in ("pool", "month", "spent", "held", "budget", "left", "projected month-end"):
        by_pool.add_column(column)
    for pool in report["pools"]:
        budget, left = pool["budget_usd"], pool["left_usd"]
        over = " (over budget)" if pool["over_budget"] else ""
        by_pool.add_row(
            pool["pool"], f"{pool['window_start'][:10]} to {pool['reset_at'][:10]}",
            f"${pool['spent_usd']:.2f}", f"${pool['held_usd']:.2f}",
            "-" if budget is None else f"${budget:.2f}",
            "-" if left is None else f"${left:.2f}",
            f"${pool['projected_usd']:.2f}{over}",
        )  # fmt: skip
    out.print(by_pool)
    out.print(
        f"total: ${report['total_usd']:.2f} spent, ${report['projected_usd']:.2f} projected "
        "by month-end",
        highlight=False,
    )
    if not report["state_ok"]:
        err.print("[red]state store unavailable: the spend shown is this replica's share[/red]")
    return 0


def cmd_config_check(args: argparse.Namespace) -> int:
    cfg = config_mod.load_config(args.file)
    table = Table(title=f"{args.file}: OK")
    for column in ("entry", "provider", "pool", "sessions", "sandbox_seconds", "concurrent"):
        table.add_column(column)
    for entry in cfg.chain:
        q = cfg.pool_quota(entry)
        table.add_row(
            entry.name, entry.provider, entry.pool,
            *(str(v) if v is not None else "-" for v in (q.sessions, q.sandbox_seconds,
                                                          q.concurrent)),
        )  # fmt: skip
    out.print(table)
    return 0


def cmd_quota(args: argparse.Namespace) -> int:
    with _router(args) as router:
        pools = sorted({e.pool for e in router.config.chain if e.name in router.entries})
        if args.pool is not None and args.pool not in pools:
            err.print(
                f"[red]no pool {args.pool!r} in this config (pools: {', '.join(pools)})[/red]"
            )
            return 2
        if args.action == "show":
            shown: dict[str, dict[str, Any]] = {}
            for v in router.status().entries:
                if args.pool in (None, v.pool):
                    shown[v.pool] = {"used": v.used, "limits": v.limits,
                                     "reset_at": v.reset_at.isoformat()}  # fmt: skip
            out.print_json(json.dumps(shown))
            return 0
        if args.pool is None:
            err.print(f"[red]quota {args.action}: name the pool[/red]")
            return 2
        if args.action == "set":
            if args.unit is None or args.value is None:
                err.print(f"[red]quota set POOL UNIT VALUE (unit: {'|'.join(UNITS)})[/red]")
                return 2
            if args.unit == "concurrent":
                return _free_slots(router.config, args.pool, int(args.value))
            router.set_usage(args.pool, args.unit, args.value)
        else:
            for unit in [args.unit] if args.unit else ["sessions", "sandbox_seconds"]:
                router.set_usage(args.pool, unit, 0)
        out.print(f"pool {args.pool}: {args.action} done")
        return 0


def _free_slots(cfg: config_mod.RouterConfig, pool: str, keep: int) -> int:
    """``quota set POOL concurrent N``: free the pool's slots until N are held.

    For slots a crashed app or a store outage left taken until ``lease_ttl``.
    Which leases lose their slot is arbitrary; their holders find them lost at
    the next heartbeat, and their seconds are metered now.
    """
    entry = next(e for e in cfg.chain if e.pool == pool)
    ref = EntryRef(
        entry.name, pool, cfg.pool_quota(entry).limits(), cfg.window(entry), entry.fingerprint()
    )

    async def free() -> tuple[int, int]:
        store = open_store(cfg.resolved_state_url(), cfg.key_prefix, tenants=cfg.counts_tenants)
        try:
            now = time.time()
            held = sorted(await store.lease_ids(ref, now))
            for lease_id in held[keep:]:
                await store.release(ref, lease_id, now)
            return len(held), max(0, len(held) - keep)
        finally:
            await store.close()

    held, freed = asyncio.run(free())
    if keep > held:
        err.print(f"[red]pool {pool}: {held} slot(s) held; concurrent can only lower it[/red]")
        return 2
    out.print(f"pool {pool}: freed {freed} of {held} concurrency slot(s)")
    return 0


def cmd_doctor(args: argparse.Namespace) -> int:
    from router.doctor import diagnose

    cfg = config_mod.load_config(args.config) if args.config else config_mod.from_env()
    create = [e.name for e in cfg.chain] if args.create_all else args.create
    try:
        checks = asyncio.run(diagnose(cfg, create, timeout=args.timeout))
    except ValueError as exc:
        err.print(f"[red]doctor: {escape(str(exc))}[/red]", highlight=False)
        return 2
    if args.json:
        out.print_json(json.dumps([{**asdict(c), "failed": c.failed} for c in checks]))
    else:
        table = Table(title="sandbox-router doctor")
        for column in ("entry", "provider", "state", "credentials", "create / run / kill",
                       "quota left", "problems"):  # fmt: skip
            table.add_column(column)
        for c in checks:
            steps = " / ".join(_secs(c.seconds.get(s)) for s in ("create", "run", "kill"))
            table.add_row(
                c.entry, c.provider, c.state,
                f"{_mark(c.credentials)} {_secs(c.seconds.get('credentials'))}",
                f"{_mark(c.cycle)} {steps}" if c.cycle != "skipped" else "skipped",
                ", ".join(f"{u} {_amount(u, v)}" for u, v in c.quota_left.items()) or "unlimited",
                escape("\n".join(c.problems)),
            )  # fmt: skip
        out.print(table)
    return 1 if any(c.failed for c in checks) else 0


def _mark(verdict: str) -> str:
    colour = {"ok": "green", "missing": "yellow", "disabled": "dim"}.get(verdict, "red")
    return f"[{colour}]{verdict}[/{colour}]"


def _secs(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    return f"{seconds * 1000:.0f}ms" if seconds < 1 else f"{seconds:.1f}s"


def _amount(unit: str, value: float) -> str:
    return f"{value / 3600:.1f}h" if unit == "sandbox_seconds" else f"{value:.0f}"


def cmd_janitor(args: argparse.Namespace) -> int:
    with _router(args) as router:
        report = router.reap()
    if args.json:
        out.print_json(json.dumps({"killed": report.killed, "kept": report.kept,
                                   "skipped": report.skipped}))  # fmt: skip
        return 0
    for entry, sandbox_id in report.killed:
        out.print(f"killed {sandbox_id} on {entry}")
    for entry, why in report.skipped.items():
        out.print(f"[dim]skipped {entry}: {escape(why)}[/dim]")
    out.print(f"{len(report.killed)} orphan(s) killed, {report.kept} leased or bound kept")
    return 0


def cmd_metrics(args: argparse.Namespace) -> int:
    with _router(args) as router:
        return run_exporter(router, args.port, args.addr, announce=out.print)


def run_exporter(
    router: Router,
    port: int,
    addr: str = "127.0.0.1",
    *,
    registry: CollectorRegistry | None = None,
    stop: threading.Event | None = None,
    announce: Callable[[str], None] = print,
) -> int:
    """``sandbox-router metrics``: `router.metrics.serve` until SIGTERM, SIGINT or ``stop``."""
    from router.metrics import serve

    stop = stop or threading.Event()
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
    server = serve(router, port, addr, registry=registry)
    host = f"[{addr}]" if ":" in addr else addr
    announce(f"serving http://{host}:{server.server_port}/metrics")
    try:
        stop.wait()
    finally:
        server.shutdown()
        server.server_close()
    return 0


def cmd_mcp(args: argparse.Namespace) -> int:
    """The MCP server (docs/mcp.md), from the optional ``mcp`` extra."""
    try:
        from router.mcp import serve
    except ModuleNotFoundError as exc:
        if (exc.name or "").partition(".")[0] != "mcp":
            raise
        err.print(
            '[red]sandbox-router mcp needs the MCP SDK: pip install "sandbox-router\\[mcp]"[/red]',
            highlight=False,
        )
        return 2
    if not args.http and (sys.stdin is None or sys.stdout is None):  # fd 0 or 1 was closed
        err.print("[red]sandbox-router mcp: the stdio transport needs stdin and stdout open "
                  "(or serve over --http)[/red]", highlight=False)  # fmt: skip
        return 2
    cfg = config_mod.load_config(args.config) if args.config else config_mod.from_env()
    if cfg.log.model_fields_set:
        _configure_logging(args, cfg.log.format, cfg.log.level)
    announce = err.print if args.http else (lambda _line: None)
    serve(cfg, http=args.http, host=args.host, port=args.port, announce=announce)
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from router.demo import run_demo, summary_table

    summary = run_demo(redis_url=args.redis, live=not args.json, metrics_port=args.metrics_port)
    if args.json:
        out.print_json(json.dumps(summary.to_json()))
    else:
        out.print(summary_table(summary))
    return 0 if summary.failed == 0 else 1


def cmd_emulate(args: argparse.Namespace) -> int:
    from emulators import EMULATORS, emulator_class

    names = sorted(EMULATORS) if args.name == "all" else [args.name]
    if args.port and len(names) > 1:
        err.print("[red]--port applies to one emulator; with `all` the ports are picked[/red]")
        return 2
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())  # before the "ready" lines
    running = []
    for name in names:
        emu = emulator_class(name)(port=args.port or 0, control_port=args.control_port or 0)
        emu.start()
        running.append(emu)
        out.print(f"[bold]{name}[/bold] emulator on {emu.url} (control API {emu.control_url})")
        for key, value in emu.sdk_env().items():
            out.print(f"  export {key}={value}")
    try:
        stop.wait()
    except KeyboardInterrupt:
        pass
    finally:
        for emu in running:
            emu.stop()
    return 0


def _port(text: str) -> int:
    """A TCP port for argparse (0: any free one), refused before anything binds."""
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port number: {text!r}") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"a port is 0 to 65535, not {port}")
    return port


def _mcp_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("--http", action="store_true", help="Streamable HTTP instead of stdio")
    p.add_argument("--host", default="127.0.0.1", help="address to bind with --http")
    p.add_argument("--port", type=_port, default=8765, help="port with --http (0: any free one)")
    p.set_defaults(func=cmd_mcp)


def _cost_options(cost: argparse.ArgumentParser) -> None:
    cost.add_argument(
        "--month",
        action="store_true",
        help="each pool's month: spent, held, budget left, projected month-end",
    )
    cost.add_argument("--tenants", action="store_true", help="the top spending tenants instead")
    cost.add_argument("--top", type=int, default=10, help="how many tenants (default 10)")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sandbox-router", description=__doc__.split("\n")[0])
    parser.add_argument("-v", "--verbose", action="store_true", help="log routing events")
    parser.add_argument(
        "--log-format",
        choices=get_args(LogFormat),
        help="logs on stderr: json lines, console (readable) or auto (console on a terminal)",
    )
    sub = parser.add_subparsers(dest="cmd", required=True)

    def with_config(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
        p.add_argument("--config", help="chain YAML (default: $SANDBOX_ROUTER_CONFIG or env)")
        return p

    p = with_config(sub.add_parser("exec", help="run a command in a routed sandbox"))
    p.add_argument("--requires", action="append", default=[], help="a required capability")
    p.add_argument("--timeout", type=float, help="acquire deadline in seconds")
    p.add_argument("--command-timeout", type=float, default=300.0, help="command timeout")
    p.add_argument("--tenant", help="the tenant the sandbox is counted to (config tenants:)")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command")
    p.set_defaults(func=cmd_exec)

    for name, func, about in (
        ("status", cmd_status, "health and quota per entry"),
        ("cost", cmd_cost, "this window's spend by entry and pool"),
        ("janitor", cmd_janitor, "kill this router's orphaned sandboxes"),
    ):
        p = with_config(sub.add_parser(name, help=about))
        p.add_argument("--json", action="store_true")
        p.set_defaults(func=func)
    _cost_options(sub.choices["cost"])

    p = sub.add_parser("config", help="config tools")
    config_sub = p.add_subparsers(dest="config_cmd", required=True)
    check = config_sub.add_parser("check", help="validate a chain file")
    check.add_argument("file")
    check.set_defaults(func=cmd_config_check)

    p = with_config(sub.add_parser("quota", help="show or correct the quota ledger"))
    p.add_argument("action", choices=["show", "set", "reset"])
    p.add_argument("pool", nargs="?")
    p.add_argument("unit", nargs="?", choices=UNITS)
    p.add_argument("value", nargs="?", type=float)
    p.set_defaults(func=cmd_quota)

    p = with_config(sub.add_parser("doctor", help="prove each entry works, with real calls"))
    p.add_argument(
        "--create", action="append", default=[], metavar="ENTRY",
        help="also create, run and kill a sandbox on ENTRY (spends a session; repeatable)",
    )  # fmt: skip
    p.add_argument("--create-all", action="store_true", help="--create every entry")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds per step (default 60)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_doctor)

    p = sub.add_parser("demo", help="a scripted day of traffic on the emulators")
    p.add_argument("--redis", help="use this Redis instead of the embedded SQLite store")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.add_argument("--metrics-port", type=_port, help="serve /metrics on this port meanwhile")
    p.set_defaults(func=cmd_demo)

    p = with_config(sub.add_parser("metrics", help="serve Prometheus /metrics (a sidecar)"))
    p.add_argument("--port", type=_port, default=9464, help="port to serve on (default 9464)")
    p.add_argument(
        "--addr",
        default="127.0.0.1",
        help="address to bind (default 127.0.0.1; 0.0.0.0 to be scraped from another host)",
    )
    p.set_defaults(func=cmd_metrics)

    _mcp_parser(with_config(sub.add_parser("mcp", help="serve the router's sandboxes over MCP")))

    p = sub.add_parser("emulate", help="run provider emulators on loopback")
    p.add_argument("name", choices=["daytona", "runloop", "modal", "e2b", "all"])
    p.add_argument("--port", type=_port, default=0)
    p.add_argument("--control-port", type=_port, default=0)
    p.set_defaults(func=cmd_emulate)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    _configure_logging(args)
    try:
        code: int = args.func(args)
    except ConfigError as exc:
        err.print(f"[red]config error:[/red] {escape(str(exc))}", highlight=False)
        return 2
    except NoProviderAvailable as exc:
        err.print(f"[red]{escape(str(exc))}[/red]", highlight=False)
        return 3
    except SandboxRouterError as exc:
        err.print(f"[red]{type(exc).__name__}: {escape(str(exc))}[/red]", highlight=False)
        return 1
    return code


if __name__ == "__main__":
    sys.exit(main())
