"""``sandbox-router doctor``: prove each configured entry works, with real calls.

For every chain entry: whether it is configured (credentials present, SDK
installed), whether the provider accepts the credentials (one list call,
which creates nothing), its health and the quota left in its pool. For the
entries asked for, one real create, run and kill cycle, each step timed:
opt-in, because it spends a session of the entry's quota (and the
provider's money). This is how a user with real keys proves the adapters
against the real clouds.

Everything goes through the router's public API: a `Router` for the status
and the credential check, and for each cycle a Router over a one-entry copy
of the config, so the acquire cannot fail over to another entry and the
session is counted in the shared ledger like any other.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Collection
from dataclasses import dataclass, field

from providers.base import LABEL_ROUTER
from providers.errors import AuthError, SandboxRouterError
from router.config import EntryConfig, RouterConfig
from router.core import EntryView, Router

__all__ = ["EntryCheck", "diagnose"]

_ECHO = "sandbox-router-doctor"


@dataclass(slots=True)
class EntryCheck:
    """What the doctor found about one chain entry.

    Attributes:
        credentials: ``ok``, ``missing`` (not configured here), ``refused``
            (the provider said no), ``error`` (it could not say), ``disabled``.
        cycle: ``ok``, ``failed``, or ``skipped`` (not asked for).
        seconds: per timed step (``credentials``, ``create``, ``run``, ``kill``).
        quota_left: per limited unit of the entry's pool, after the cycle.
        problems: one sentence each, for people.
    """

    entry: str
    provider: str
    pool: str
    state: str
    credentials: str
    cycle: str = "skipped"
    seconds: dict[str, float] = field(default_factory=dict)
    quota_left: dict[str, float] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    @property
    def failed(self) -> bool:
        """A check that ran went wrong (an entry not configured here is only reported)."""
        return self.credentials in ("refused", "error") or self.cycle == "failed"


async def diagnose(
    config: RouterConfig, create: Collection[str] = (), *, timeout: float = 60.0
) -> list[EntryCheck]:
    """Check every entry of ``config``; run a create, run, kill cycle on ``create``.

    Raises:
        ValueError: ``create`` names an entry the chain does not have.
    """
    names = [e.name for e in config.chain]
    if unknown := sorted(set(create) - set(names)):
        raise ValueError(f"no entry {', '.join(unknown)} in this config (entries: {names})")
    async with Router(config) as router:
        views = {v.name: v for v in (await router.astatus()).entries}
        checks = []
        for entry in config.chain:
            view = views.get(entry.name)
            if view is None:
                checks.append(EntryCheck(entry.name, entry.provider, entry.pool, "-", "disabled"))
                continue
            check = EntryCheck(entry.name, entry.provider, entry.pool, view.state, "missing")
            checks.append(check)
            if not view.configured:
                check.problems.append(view.unconfigured_reason or "not configured")
                continue
            if view.state not in ("closed", "half_open"):
                check.problems.append(f"{view.state}: {view.detail}" if view.detail else view.state)
            await _credentials(router, config, check, timeout)
            if entry.name in create and check.credentials == "ok":
                await _cycle(config, entry, check, timeout)
        for view in (await router.astatus()).entries:
            for check in checks:
                if check.entry == view.name:
                    check.quota_left = _left(view)
    return checks


async def _credentials(
    router: Router, config: RouterConfig, check: EntryCheck, timeout: float
) -> None:
    started = time.perf_counter()
    try:
        async with asyncio.timeout(timeout):
            await router.provider(check.entry).list({LABEL_ROUTER: config.key_prefix})
    except AuthError as exc:
        check.credentials = "refused"
        check.problems.append(f"credentials refused: {exc}")
    except (SandboxRouterError, TimeoutError) as exc:
        check.credentials = "error"
        check.problems.append(f"listing sandboxes failed: {type(exc).__name__}: {exc}")
    else:
        check.credentials = "ok"
    check.seconds["credentials"] = time.perf_counter() - started


async def _cycle(
    config: RouterConfig, entry: EntryConfig, check: EntryCheck, timeout: float
) -> None:
    one = config.model_copy(update={"chain": [entry]})
    step, started = "create", time.perf_counter()
    try:
        async with Router(one) as router:
            async with await router.aacquire(timeout=timeout) as lease:
                check.seconds["create"] = time.perf_counter() - started
                step, started = "run", time.perf_counter()
                result = await lease.sandbox.run(f"echo {_ECHO}", timeout=timeout)
                check.seconds["run"] = time.perf_counter() - started
                step, started = "kill", time.perf_counter()
            check.seconds["kill"] = time.perf_counter() - started
    except SandboxRouterError as exc:
        check.cycle = "failed"
        check.problems.append(f"{step}: {type(exc).__name__}: {exc}")
        return
    if result.exit_code != 0 or result.stdout.strip() != _ECHO:
        check.cycle = "failed"
        shown = result.stdout.strip()[:80]
        check.problems.append(f"run: `echo {_ECHO}` exited {result.exit_code} with {shown!r}")
        return
    check.cycle = "ok"


def _left(view: EntryView) -> dict[str, float]:
    return {
        unit: max(0.0, limit - view.used[unit])
        for unit, limit in view.limits.items()
        if limit is not None
    }
