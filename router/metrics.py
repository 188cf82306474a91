"""Prometheus metrics: routing events as counters and histograms, the fleet's state as gauges.

Two halves, both named ``sandbox_router_*`` and labelled only by entry, pool,
provider, unit, outcome, reason and state names (never a sandbox id, a lease,
a session or a secret):

* `RouterMetrics` counts what this process saw: its `hook` is a router event
  hook (``router.events``) feeding counters (acquisitions, failovers, breaker
  transitions, refunds, state-store errors...) and histograms (whole-acquire
  and per-entry create latency).
* `StateCollector` reads the shared state at scrape time, with ONE store read
  per scrape (``Router.status``): quota used / limit / remaining per pool and
  unit, the window's start and reset, live leases and the health of every
  entry. Every replica reading the same store reports the same numbers.

Ways to run it:

* in an app: ``instrument(router)`` (or ``instrument(router, registry=...)``
  for an app's own registry) and expose the registry as the app already does;
* a sidecar: ``sandbox-router metrics --port N`` (`router.cli.run_exporter`), or
  ``serve(router, port)`` from Python;
* gunicorn and other pre-fork servers: set ``PROMETHEUS_MULTIPROC_DIR`` for
  every worker, call ``instrument(router)`` in each, and serve
  `multiprocess_registry` (``serve`` and the sidecar do so by themselves when
  the variable is set): the workers' counters and histograms are summed from
  the directory and the gauges come from the shared state.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, assert_never
from wsgiref.simple_server import WSGIServer

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.exposition import start_http_server
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector

from policies.latency import SAMPLES, LatencySketch
from policies.quota import UNITS
from providers.errors import StateUnavailable
from router.events import (
    Acquired,
    AcquireFailed,
    BreakerTransition,
    BudgetExhausted,
    Created,
    CreateFailed,
    Failover,
    FreesOwed,
    HedgeSettled,
    HedgeStarted,
    KillAbandoned,
    KillFailed,
    LateCreate,
    LeaseLost,
    OutageHandedOver,
    Paused,
    QuotaChanged,
    Reaped,
    Refund,
    Released,
    Resumed,
    RouterEvent,
    SessionClosed,
    SessionHeld,
    SessionLost,
    StateError,
    StateWarning,
    TaskFailed,
    WarmClaimed,
    WarmCreated,
    WarmKilled,
    WarmMissed,
    WarmSized,
)

if TYPE_CHECKING:
    from router.core import EntryView, Router

__all__ = [
    "BREAKER_STATES",
    "BUCKETS",
    "ENTRY_STATES",
    "PREFIX",
    "RouterMetrics",
    "StateCollector",
    "instrument",
    "multiprocess_registry",
    "serve",
]

PREFIX = "sandbox_router"

# Sandbox starts take tens of milliseconds (local) to a minute (a cold cloud
# template); an acquire that fails over can take longer still.
BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0)

# sandbox_router_breaker_state values
CLOSED, HALF_OPEN, OPEN, BLOCKED = 0, 1, 2, 3
BREAKER_STATES = {"closed": CLOSED, "half_open": HALF_OPEN, "open": OPEN}
BLOCKS = ("misconfigured", "exhausted", "rate_limited", "capacity", "unconfigured")
# sandbox_router_entry_state{state=...}: exactly one is 1 per entry
ENTRY_STATES = ("closed", "half_open", "open", *BLOCKS)

# Operations that report a state_error (pre-set to 0 so the first error shows as an increase).
STATE_OPERATIONS = ("reserve", "commit", "refund", "release", "heartbeat", "session", "snapshot")


class RouterMetrics:
    """The counters and histograms of one registry, fed by `hook`.

    Make it through `instrument` (one per registry); several routers in one
    process may share it.
    """

    def __init__(self, registry: CollectorRegistry | None = REGISTRY) -> None:
        def counter(name: str, doc: str, labels: Sequence[str]) -> Counter:
            return Counter(f"{PREFIX}_{name}", doc, labels, registry=registry)

        self.acquisitions = counter(
            "acquisitions",
            "Acquire calls by the entry that served (none when nothing could) and outcome: "
            "success, resumed (a sticky session's sandbox), no_provider, sandbox_error.",
            ("entry", "outcome"),
        )
        self.failovers = counter(
            "failovers",
            "Failovers after a failed create: from_entry is the entry that failed, to_entry "
            "the next one in the order (none at the end of the chain), reason the error class.",
            ("from_entry", "to_entry", "reason"),
        )
        self.create_failures = counter(
            "create_failures",
            "Failed create attempts (each retry counts) by entry and reason.",
            ("entry", "reason"),
        )
        self.breaker_transitions = counter(
            "breaker_transitions",
            "Circuit breaker transitions by entry.",
            ("entry", "from_state", "to_state"),
        )
        self.refunds = counter(
            "refunds",
            "Quota reservations given back after a failed create, by entry and reason.",
            ("entry", "reason"),
        )
        self.state_errors = counter(
            "state_errors",
            "State store operations that failed, by operation and on_state_error mode.",
            ("operation", "mode"),
        )
        self.releases = counter("releases", "Leases released, by entry.", ("entry",))
        self.sandbox_seconds = counter(
            "sandbox_seconds",
            "Lease seconds metered on release (and late creates' seconds until killed), by entry.",
            ("entry",),
        )
        self.cost = counter(
            "cost_usd",
            "USD the released leases cost (their resources times metered seconds at the "
            "entry's price, plus its per-sandbox fee), and what the router spent around them "
            "(late creates and hedge losers, warm sandboxes' idle time, paused storage), by "
            "entry and quota pool.",
            ("entry", "pool"),
        )
        self.leases_lost = counter(
            "leases_lost",
            "Leases found expired by their own heartbeat (the app stalled), by entry.",
            ("entry",),
        )
        self.late_creates = counter(
            "late_creates",
            "Creates that ended after the acquire stopped waiting, or unanswered, by entry and "
            "outcome: killed (answered late: counted and killed), found (unanswered, found by "
            "its lease label: counted and killed), failed (refunded), unanswered.",
            ("entry", "outcome"),
        )
        self.kill_failures = counter(
            "kill_failures",
            "Sandbox kill attempts that failed (each is tried again in the background).",
            ("entry",),
        )
        self.kills_abandoned = counter(
            "kills_abandoned",
            "Sandboxes the router stopped trying to kill, left to the reaper, by entry.",
            ("entry",),
        )
        self.sessions_lost = counter(
            "sessions_lost",
            "Sticky sessions whose sandbox was gone (a new one was bound), by entry.",
            ("entry",),
        )
        self.reaped = counter(
            "orphans_reaped", "Orphaned sandboxes killed by the janitor, by entry.", ("entry",)
        )
        self.paused = counter(
            "sandboxes_paused",
            "Sandboxes paused at a lease's end (their bill stops), by entry.",
            ("entry",),
        )
        self.resumed = counter(
            "sandboxes_resumed", "Paused sandboxes woken under a new lease, by entry.", ("entry",)
        )
        self.budget_exhausted = counter(
            "budget_exhausted",
            "Leases whose usd budget could not renew their cover, by what followed (kill: "
            "ended when the cover did; warn: ran on as an overdraft) and whose budget it was "
            "(pool, or tenant: the lease's tenant's, never named here).",
            ("entry", "pool", "action", "budget"),
        )
        self.quota_changes = counter(
            "quota_adjustments",
            "Operator overwrites of a pool's usage (sandbox-router quota set/reset).",
            ("pool", "unit"),
        )
        self.warm_hits = counter(
            "warm_hits", "Acquires served by a warm sandbox (claimed from the pool).", ("entry",)
        )
        self.warm_misses = counter(
            "warm_misses",
            "Acquires a warm sandbox could have served that found the pool empty (created).",
            ("entry",),
        )
        self.warm_created = counter(
            "warm_created", "Sandboxes the refill made for a warm pool.", ("entry",)
        )
        self.warm_killed = counter(
            "warm_killed",
            "Warm sandboxes killed unclaimed, by reason: max_idle, unreachable (a claim could "
            "not connect), drained (the entry failed).",
            ("entry", "reason"),
        )
        self.warm_idle_seconds = counter(
            "warm_idle_seconds",
            "Seconds warm sandboxes waited in the pool before a claim or a kill (what the pool "
            "costs), by state: running (metered into sandbox_seconds) or paused (not metered).",
            ("entry", "state"),
        )
        self.hedges_started = counter(
            "hedges_started",
            "Hedged creates: entry's create was slow, hedge_entry's started beside it.",
            ("entry", "hedge_entry"),
        )
        self.hedge_wins = counter(
            "hedge_wins",
            "Hedged acquires that hedge_entry's create won (the slow entry's was killed).",
            ("entry", "hedge_entry"),
        )
        self.create_latency = Gauge(
            f"{PREFIX}_create_latency_seconds",
            f"This process's recent successful create latency by entry: the quantile over "
            f"its last {SAMPLES} creates (what a hedge's percentile reads).",
            ("entry", "quantile"),
            registry=registry,
        )
        self._sketches: dict[str, LatencySketch] = {}
        self.acquire_seconds = Histogram(
            f"{PREFIX}_acquire_seconds",
            "Whole acquire latency (retries and failovers included), by the entry that served "
            "(none when nothing could).",
            ("entry",),
            buckets=BUCKETS,
            registry=registry,
        )
        self.create_seconds = Histogram(
            f"{PREFIX}_create_seconds",
            "One provider create call's latency by entry and outcome (success, failure).",
            ("entry", "outcome"),
            buckets=BUCKETS,
            registry=registry,
        )

    def _created(self, event: Created | HedgeStarted | HedgeSettled) -> None:
        """A create that made a sandbox (and this process's recent latency), or a hedge."""
        match event:
            case Created(entry=entry, latency=latency):
                self.create_seconds.labels(entry, "success").observe(latency)
                sketch = self._sketches.setdefault(entry, LatencySketch())
                sketch.add(latency)
                for label, q in (("0.5", 0.5), ("0.95", 0.95)):
                    self.create_latency.labels(entry, label).set(sketch.quantile(q) or 0.0)
            case HedgeStarted(entry=entry, hedge_entry=hedge):
                self.hedges_started.labels(entry, hedge).inc()
            case HedgeSettled(entry=entry, hedge_entry=hedge, winner=winner):
                if winner == hedge:
                    self.hedge_wins.labels(entry, hedge).inc()
            case _:
                assert_never(event)

    def prime(self, router: Router) -> None:
        """Create the router's label sets at zero, so rates and alerts see the first event."""
        pools = {e.name: e.pool for e in router.config.chain}
        for entry in router.entries:
            self.acquisitions.labels(entry, "success")
            self.releases.labels(entry)
            self.cost.labels(entry, pools[entry])
        self.acquisitions.labels("none", "no_provider")
        for operation in STATE_OPERATIONS:
            self.state_errors.labels(operation, router.config.on_state_error)

    def hook(self, event: RouterEvent) -> None:
        """A router event hook: count one event."""
        match event:
            case Acquired(entry=entry, latency=latency, resumed=resumed):
                self.acquisitions.labels(entry, "resumed" if resumed else "success").inc()
                self.acquire_seconds.labels(entry).observe(latency)
            case AcquireFailed(latency=latency):
                self.acquisitions.labels("none", "no_provider").inc()
                self.acquire_seconds.labels("none").observe(latency)
            case Created() | HedgeStarted() | HedgeSettled():
                self._created(event)
            case CreateFailed(entry=entry, reason=reason, latency=latency):
                self.create_seconds.labels(entry, "failure").observe(latency)
                self.create_failures.labels(entry, reason).inc()
                if reason == "sandbox_error":  # never failed over: the acquire ends here
                    self.acquisitions.labels(entry, "sandbox_error").inc()
            case Failover(from_entry=source, to_entry=target, reason=reason):
                self.failovers.labels(source, target, reason).inc()
            case Refund(entry=entry, reason=reason):
                self.refunds.labels(entry, reason).inc()
            case BreakerTransition(entry=entry, from_state=before, to_state=after):
                self.breaker_transitions.labels(entry, before, after).inc()
            case StateError(operation=operation, mode=mode):
                self.state_errors.labels(operation, mode).inc()
            case Released() | LateCreate() | Resumed() | Reaped():
                self._charged(event)
            case BudgetExhausted(entry=entry, pool=pool, action=action, budget=budget):
                self.budget_exhausted.labels(entry, pool, action, budget).inc()
            case LeaseLost() | KillFailed() | KillAbandoned() | SessionLost() | Paused():
                self._per_entry(event).labels(event.entry).inc()
            case QuotaChanged(pool=pool, unit=unit):
                self.quota_changes.labels(pool, unit).inc()
            case WarmClaimed() | WarmKilled() | WarmMissed() | WarmCreated():
                self._warm(event)
            case (
                StateWarning()
                | SessionClosed()
                | SessionHeld()
                | FreesOwed()
                | TaskFailed()
                | OutageHandedOver()
            ):
                pass  # nothing to count
            case WarmSized():
                pass  # the vendor's ready count is the warm_ready gauge
            case _:
                assert_never(event)

    def _per_entry(
        self,
        event: LeaseLost | KillFailed | KillAbandoned | SessionLost | Paused | Resumed,
    ) -> Counter:
        """The counter of an event that counts once per entry."""
        match event:
            case LeaseLost():
                return self.leases_lost
            case KillFailed():
                return self.kill_failures
            case KillAbandoned():
                return self.kills_abandoned
            case SessionLost():
                return self.sessions_lost
            case Paused():
                return self.paused
            case Resumed():
                return self.resumed
            case _:
                assert_never(event)

    def _charged(self, event: Released | LateCreate | Resumed | Reaped) -> None:
        """A lease's end, a late create's, a resume, a reap: what each metered and cost."""
        match event:
            case Released(entry=entry, seconds=seconds, cost=cost, pool=pool):
                self.releases.labels(entry).inc()
                if seconds:
                    self.sandbox_seconds.labels(entry).inc(seconds)
                if cost is not None:
                    self.cost.labels(entry, pool).inc(cost)
            case LateCreate(entry=entry, outcome=outcome, seconds=seconds, cost=cost, pool=pool):
                self.late_creates.labels(entry, outcome).inc()
                if seconds:
                    self.sandbox_seconds.labels(entry).inc(seconds)
                self._spent(entry, pool, cost)
            case Resumed(entry=entry, cost=cost, pool=pool):
                self.resumed.labels(entry).inc()
                self._spent(entry, pool, cost)
            case Reaped(entry=entry, cost=cost, pool=pool):
                self.reaped.labels(entry).inc()
                self._spent(entry, pool, cost)
            case _:
                assert_never(event)

    def _spent(self, entry: str, pool: str, cost: float | None) -> None:
        """Add what the router spent around the leases to the cost counter."""
        if cost:
            self.cost.labels(entry, pool).inc(cost)

    def _warm(self, event: WarmClaimed | WarmKilled | WarmMissed | WarmCreated) -> None:
        match event:
            case WarmClaimed(entry=entry, paused=paused, idle=idle, cost=cost, pool=pool):
                self.warm_hits.labels(entry).inc()
                self.warm_idle_seconds.labels(entry, "paused" if paused else "running").inc(idle)
                self._spent(entry, pool, cost)
            case WarmKilled(entry=entry, reason=reason, paused=paused, idle=idle, cost=cost,
                            pool=pool):  # fmt: skip
                self.warm_killed.labels(entry, reason.partition(":")[0]).inc()
                self.warm_idle_seconds.labels(entry, "paused" if paused else "running").inc(idle)
                self._spent(entry, pool, cost)
            case WarmMissed(entry=entry):
                self.warm_misses.labels(entry).inc()
            case WarmCreated(entry=entry, cost=cost, pool=pool):
                self.warm_created.labels(entry).inc()
                self._spent(entry, pool, cost)
            case _:
                assert_never(event)


class StateCollector(Collector):
    """Gauges of the shared state, read once per scrape through ``Router.status``.

    Every replica reading the same store reports the same quota numbers. When
    the store cannot be read, only ``sandbox_router_state_up 0`` and the
    entries' info are exported (a replica's fail-open share is not the
    fleet's truth).

    The health gauges report the state in force at scrape time: an open
    breaker whose cooldown is over reads as half-open (the next acquire
    probes it), a rate-limit, capacity or exhausted block whose end has
    passed reads as closed.
    """

    def __init__(self, router: Router, clock: Callable[[], float] = time.time) -> None:
        self.router = router
        self.clock = clock

    def describe(self) -> Iterable[Metric]:
        return list(self._families())

    def _families(self) -> Iterator[GaugeMetricFamily]:
        def gauge(name: str, doc: str, labels: Sequence[str] = ()) -> GaugeMetricFamily:
            return GaugeMetricFamily(f"{PREFIX}_{name}", doc, labels=labels)

        yield gauge("state_up", "1 when the shared state store answered this scrape, else 0.")
        yield gauge("state_read_seconds", "How long this scrape's one state read took.")
        yield gauge(
            "entry_info", "Chain entries: their provider and quota pool (always 1).",
            ("entry", "provider", "pool"),
        )  # fmt: skip
        yield gauge(
            "breaker_state",
            "Entry health: 0 closed, 1 half-open, 2 open, 3 blocked (misconfigured, exhausted, "
            "rate_limited, capacity or unconfigured: see sandbox_router_entry_state).",
            ("entry",),
        )
        yield gauge(
            "entry_state",
            "1 for the entry's current state (closed, half_open, open, misconfigured, "
            "exhausted, rate_limited, capacity, unconfigured), 0 for the others.",
            ("entry", "state"),
        )
        yield gauge(
            "entry_available",
            "1 when the entry could serve now: configured, circuit closed or half-open, "
            "not blocked, and quota left in every limited unit of its pool.",
            ("entry",),
        )
        yield gauge("live_leases", "Unexpired leases held on the entry, fleet-wide.", ("entry",))
        yield gauge(
            "warm_ready",
            "Warm sandboxes ready to claim in the entry's pool, fleet-wide (entries with warm; "
            "for a vendor-held pool, what the vendor last said it held).",
            ("entry",),
        )
        yield gauge(
            "quota_used",
            "Used this window: sessions (sandboxes created), sandbox_seconds (metered), "
            "concurrent (live leases), usd (settled spend).",
            ("pool", "unit"),
        )
        yield gauge(
            "quota_held",
            "What the live leases hold against the pool's usd budget on top of what it used.",
            ("pool", "unit"),
        )
        yield gauge("quota_limit", "The pool's limit (limited units only).", ("pool", "unit"))
        yield gauge(
            "quota_remaining",
            "Limit minus used (usd: minus held too), floored at 0 (limited units only).",
            ("pool", "unit"),
        )
        yield gauge(
            "quota_window_start_timestamp_seconds",
            "When the pool's current quota window started (Unix time).",
            ("pool",),
        )
        yield gauge(
            "quota_window_reset_timestamp_seconds",
            "When the pool's quota window resets (Unix time).",
            ("pool",),
        )
        yield gauge(
            "quota_projected_exhaustion_timestamp_seconds",
            "When the unit runs out at this window's average rate so far (units with a limit "
            "and some usage; the scrape time when already exhausted).",
            ("pool", "unit"),
        )
        yield gauge(
            "spend_projected_usd",
            "The pool's settled spend (quota_used{unit=\"usd\"}) at its window's reset if it "
            "goes on at this window's average rate: the projected month-end.",
            ("pool",),
        )

    def collect(self) -> Iterable[Metric]:
        fam = {f.name.removeprefix(f"{PREFIX}_"): f for f in self._families()}
        started = time.perf_counter()
        status = self.router.status()
        fam["state_read_seconds"].add_metric([], time.perf_counter() - started)
        fam["state_up"].add_metric([], 1.0 if status.state_ok else 0.0)
        for view in status.entries:
            fam["entry_info"].add_metric([view.name, view.provider, view.pool], 1.0)
        if not status.state_ok:
            return [fam["state_up"], fam["state_read_seconds"], fam["entry_info"]]
        now = self.clock()
        windows = {e.name: self.router.config.window(e) for e in self.router.config.chain}
        pools: dict[str, EntryView] = {}
        for view in status.entries:
            pools.setdefault(view.pool, view)
            state = _effective_state(view, now)
            value = BREAKER_STATES.get(state, BLOCKED)
            fam["breaker_state"].add_metric([view.name], float(value))
            for name in ENTRY_STATES:
                fam["entry_state"].add_metric([view.name, name], 1.0 if name == state else 0.0)
            committed = {**view.used, "usd": view.used["usd"] + view.usd_held}
            room = all(
                limit is None or committed[unit] < limit for unit, limit in view.limits.items()
            )
            available = value in (CLOSED, HALF_OPEN) and room
            fam["entry_available"].add_metric([view.name], 1.0 if available else 0.0)
            fam["live_leases"].add_metric([view.name], float(view.live_leases))
        with contextlib.suppress(StateUnavailable):  # the store went away since the status
            for entry, ready in self.router.warm_ready().items():
                fam["warm_ready"].add_metric([entry], float(ready))
        for pool, view in pools.items():
            reset = view.reset_at.timestamp()
            start = windows[view.name].bounds(reset - 1.0)[0].timestamp()
            fam["quota_window_start_timestamp_seconds"].add_metric([pool], start)
            fam["quota_window_reset_timestamp_seconds"].add_metric([pool], reset)
            fam["quota_held"].add_metric([pool, "usd"], view.usd_held)
            fam["spend_projected_usd"].add_metric([pool], view.usd_projected)
            for unit in UNITS:
                used, limit = view.used[unit], view.limits[unit]
                fam["quota_used"].add_metric([pool, unit], used)
                if limit is None:
                    continue
                held = view.usd_held if unit == "usd" else 0.0
                fam["quota_limit"].add_metric([pool, unit], float(limit))
                fam["quota_remaining"].add_metric([pool, unit], max(0.0, limit - used - held))
                if unit in view.exhausted_at:
                    fam["quota_projected_exhaustion_timestamp_seconds"].add_metric(
                        [pool, unit], view.exhausted_at[unit].timestamp()
                    )
        return list(fam.values())


def _effective_state(view: EntryView, now: float) -> str:
    """The entry's state in force at ``now`` (see `StateCollector`)."""
    state = view.state
    if state == "open" and view.until is not None and view.until.timestamp() <= now:
        return "half_open"
    if state in ("exhausted", "rate_limited", "capacity") and (
        view.until is not None and view.until.timestamp() <= now
    ):
        return "closed"
    return state


# One RouterMetrics per registry (a metric name can be registered once), and
# the router whose state each registry exports.
_METRICS: weakref.WeakKeyDictionary[CollectorRegistry, RouterMetrics] = weakref.WeakKeyDictionary()
_STATE: weakref.WeakKeyDictionary[CollectorRegistry, StateCollector] = weakref.WeakKeyDictionary()
_LOCK = threading.Lock()


def instrument(
    router: Router,
    registry: CollectorRegistry = REGISTRY,
    *,
    state: bool = True,
    clock: Callable[[], float] = time.time,
) -> RouterMetrics:
    """Count ``router``'s events into ``registry`` and export its shared state there.

    Idempotent for one router and registry. ``state=False`` leaves the state
    gauges out (e.g. when a sidecar exports them). A registry exports the
    state of one router: give a second router its own registry.
    """
    with _LOCK:
        metrics = _METRICS.get(registry)
        if metrics is None:
            metrics = _METRICS[registry] = RouterMetrics(registry)
        if metrics.hook not in router.hooks:
            router.hooks.append(metrics.hook)
        metrics.prime(router)
        if state:
            _register_state(registry, router, clock)
    return metrics


def _register_state(
    registry: CollectorRegistry, router: Router, clock: Callable[[], float]
) -> None:
    current = _STATE.get(registry)
    if current is not None:
        if current.router is not router:
            raise ValueError(
                "this registry already exports another router's state; "
                "give each router its own registry"
            )
        return
    collector = StateCollector(router, clock)
    registry.register(collector)
    _STATE[registry] = collector


def multiprocess_registry(
    router: Router | None = None,
    path: str | os.PathLike[str] | None = None,
    *,
    clock: Callable[[], float] = time.time,
) -> CollectorRegistry:
    """A registry summing every process's counters and histograms from ``path``.

    ``path`` defaults to ``$PROMETHEUS_MULTIPROC_DIR`` (the directory the
    workers write to). With ``router``, the shared-state gauges are added.
    Build it per scrape or once: it reads the directory at each collection.
    """
    directory = os.fspath(path) if path is not None else os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if not directory:
        raise ValueError("multiprocess mode needs PROMETHEUS_MULTIPROC_DIR (or path=...)")
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=directory)  # type: ignore[no-untyped-call]
    if router is not None:
        _register_state(registry, router, clock)
    return registry


def serve(
    router: Router,
    port: int,
    addr: str = "127.0.0.1",
    *,
    registry: CollectorRegistry | None = None,
) -> WSGIServer:
    """Serve /metrics on ``addr:port`` from a daemon thread; returns the server.

    Serves ``registry`` with ``router`` instrumented into it. Without
    ``registry``: in multiprocess mode (``PROMETHEUS_MULTIPROC_DIR`` set)
    `multiprocess_registry` (the workers' summed counters and histograms plus
    the state gauges), else a new registry of this router's metrics alone
    (pass ``registry=prometheus_client.REGISTRY`` to serve an app's default
    registry). ``port=0`` picks a free port (``server.server_port``). Stop it
    with ``server.shutdown()`` then ``server.server_close()``.
    """
    if registry is None and os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        registry = multiprocess_registry(router)
    else:
        registry = CollectorRegistry() if registry is None else registry
        instrument(router, registry)
    server, _thread = start_http_server(port, addr, registry)
    return server
