"""What every provider emulator shares: faults, account quotas, records, a thread.

An emulator is a local server that speaks one vendor's wire protocol well
enough that the unmodified vendor SDK works against it. This module holds
the parts that do not depend on the protocol:

* `FaultSpec` / `FaultBook`: inject, per operation, a status (429 with
  Retry-After, 401, 403 quota message, 5xx), a delay, a hang or a dropped
  connection, for N times or with a probability.
* `AccountQuota`: a per-API-key cap on concurrent sandboxes and on sandboxes
  created per window, enforced the way the real service does (each emulator
  turns a `QuotaViolation` into its vendor's own error).
* `SandboxRecord`: every sandbox ever created and how it ended, so tests can
  reconcile the router's counts with the provider's.
* `Emulator`: runs the server on its own event loop in a background thread,
  on a free loopback port, with a small HTTP control API beside it
  (``/faults``, ``/quota``, ``/records``, ``/reset``) for emulators started
  from the CLI. Sandboxes are real: `emulators.filesystem.GuestSandbox`.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import fcntl
import functools
import json
import os
import random
import secrets
import socket
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, NoReturn, TypeVar

from aiohttp import web

from emulators.confinement import choose
from emulators.filesystem import GuestSandbox, PathRefused
from emulators.latency import LatencyProfile
from providers.base import SandboxSpec
from providers.local import LocalOptions, LocalProvider
from providers.local.processes import born

__all__ = [
    "AccountQuota",
    "Emulator",
    "EmulatorCore",
    "FaultBook",
    "FaultSpec",
    "QuotaViolation",
    "SandboxRecord",
    "free_port",
    "http_fault_middleware",
    "unknown_route_middleware",
]

T = TypeVar("T")


_PORTS = range(20000, 32768)  # below Linux's ephemeral range, where bind(0) and clients draw
_handed_out: set[int] = set()
# Every process drawing ports here lists its own, and who it is, in this file (under
# a lock beside it): a process that exits leaves ports anyone may draw again.
_REGISTRY = Path(tempfile.gettempdir()) / "sandbox-router-emulator-ports.json"


def free_port() -> int:
    """A loopback port free now, never handed out before by this process nor held by
    another live process that drew it here.

    The port is bound later by someone else (a server, a sandbox's server),
    so it is drawn at random below the ephemeral range: the kernel's own
    picks (``bind(0)``, every outgoing connection) then never land on it, and
    the registry keeps two processes (pytest-xdist's workers, each starting
    emulators) from drawing the same one before either binds it.
    """
    with _registry() as held:
        for _ in range(1000):
            port = random.choice(_PORTS)
            if port in _handed_out or str(port) in held:
                continue
            with socket.socket() as probe:
                try:
                    probe.bind(("127.0.0.1", port))
                except OSError:
                    continue
            _handed_out.add(port)
            held[str(port)] = [os.getpid(), born(os.getpid())]  # told from a later pid's
            return port
    raise RuntimeError(f"no free loopback port in {_PORTS.start}-{_PORTS.stop - 1}")


@contextlib.contextmanager
def _registry() -> Iterator[dict[str, list[int | None]]]:
    """The registry's ports by holder (pid and start time), those of processes that
    exited left out; written back on exit, all under its lock."""
    with open(_REGISTRY.with_suffix(".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            held = json.loads(_REGISTRY.read_text())
        except (OSError, ValueError):
            held = {}
        alive = functools.cache(lambda pid, start: born(pid) == start)
        held = {port: owner for port, owner in held.items() if alive(*owner)}
        yield held
        scratch = _REGISTRY.with_suffix(f".{os.getpid()}")
        scratch.write_text(json.dumps(held))
        os.replace(scratch, _REGISTRY)


_LATENCIES = {"create": "latency", "resume": "resume_latency"}  # control port phase -> core


@dataclass
class FaultSpec:
    """One injected fault.

    Attributes:
        op: the operation it applies to (``create``, ``get``, ``list``,
            ``kill``, ``exec``, ``files``, ``connect``, ...; ``*`` for any).
        status: answer this status (HTTP code; gRPC emulators map it).
        message: the error message (vendor-shaped default when None).
        retry_after: seconds for a Retry-After header / retry detail.
        delay: seconds to wait before answering (or before the fault).
        hang: never answer (until the client gives up or the server stops).
        drop: close the connection without answering (with ``after``: once the
            work is done, as a connection lost on the way back).
        times: how many requests it hits; None for every one.
        probability: chance that a matching request is hit.
        api_key: only requests with this key; None for all.
        after: apply the delay, hang or drop after doing the work (a create
            that succeeds on the provider's side but answers late, or never
            answers), not before.
    """

    op: str = "*"
    status: int | None = None
    message: str | None = None
    retry_after: float | None = None
    delay: float = 0.0
    hang: bool = False
    drop: bool = False
    times: int | None = 1
    probability: float = 1.0
    api_key: str | None = None
    after: bool = False
    id: str = field(default_factory=lambda: secrets.token_hex(4))

    def __post_init__(self) -> None:
        if not 0.0 <= self.probability <= 1.0:
            raise ValueError(f"fault probability must be in [0, 1], got {self.probability}")
        if self.times is not None and self.times < 0:
            raise ValueError(f"fault times must be >= 0, got {self.times}")


class FaultBook:
    """The faults in force; thread-safe because tests add them from outside."""

    def __init__(self, seed: int | None = None) -> None:
        self._lock = threading.Lock()
        self._faults: list[FaultSpec] = []
        self._rng = random.Random(seed)
        self.hits: dict[str, int] = {}

    def add(self, fault: FaultSpec) -> FaultSpec:
        with self._lock:
            self._faults.append(fault)
        return fault

    def clear(self) -> None:
        with self._lock:
            self._faults.clear()

    def active(self) -> list[FaultSpec]:
        with self._lock:
            return list(self._faults)

    def take(self, op: str, api_key: str | None = None) -> FaultSpec | None:
        """The fault hitting this request, if any (consumes one of its `times`)."""
        with self._lock:
            for fault in self._faults:
                if fault.op not in ("*", op):
                    continue
                if fault.api_key is not None and fault.api_key != api_key:
                    continue
                if self._rng.random() >= fault.probability:
                    continue
                if fault.times is not None:
                    fault.times -= 1
                    if fault.times <= 0:
                        self._faults.remove(fault)
                self.hits[op] = self.hits.get(op, 0) + 1
                return fault
        return None


@dataclass
class AccountQuota:
    """An account's limits as the provider enforces them."""

    max_concurrent: int | None = None
    max_created: int | None = None
    created: int = 0


class QuotaViolation(Exception):
    """The emulated account is over a limit; ``kind`` is concurrent or created."""

    def __init__(self, kind: str, limit: int) -> None:
        super().__init__(f"{kind} limit {limit} reached")
        self.kind = kind
        self.limit = limit


@dataclass
class SandboxRecord:
    id: str
    api_key_hint: str
    labels: dict[str, str]
    created_at: float
    expires_at: float | None = None
    killed_at: float | None = None
    ended_by: str | None = None  # "kill" or "expired"
    paused: bool = False  # a paused sandbox runs nothing and takes no concurrency slot

    @property
    def alive(self) -> bool:
        return self.killed_at is None


_DISK_MB = 10 * 1024  # a sandbox disk of several GiB, as the vendors give


class EmulatorCore:
    """Sandboxes, records, quotas and faults of one emulated account set."""

    def __init__(self, name: str, root: Path, *, isolation: str = "auto") -> None:
        self.name = name
        self.faults = FaultBook()
        self.quotas: dict[str | None, AccountQuota] = {}
        self.records: dict[str, SandboxRecord] = {}
        self.sandboxes: dict[str, GuestSandbox] = {}
        self.accepted_keys: set[str] | None = None
        self.latency: LatencyProfile | None = None
        self.resume_latency: LatencyProfile | None = None
        self._rng = random.Random()
        self._lock = threading.Lock()
        self.isolation = isolation
        # `GuestSandbox` confines the commands with the sandbox's own root (and says once
        # when it cannot), so the provider that runs them runs them bare.
        self.confinement = choose(isolation)
        # A vendor bounds a file by its sandbox's disk, not by the local 512 MiB rlimit.
        unbounded = LocalOptions(root=root, isolation="none", file_size_mb=_DISK_MB)
        self.local = LocalProvider(f"{name}-emulator", unbounded)

    # -- accounts ---------------------------------------------------------
    def key_ok(self, api_key: str | None) -> bool:
        return bool(api_key) and (self.accepted_keys is None or api_key in self.accepted_keys)

    def set_quota(
        self,
        max_concurrent: int | None = None,
        max_created: int | None = None,
        api_key: str | None = None,
    ) -> None:
        with self._lock:
            self.quotas[api_key] = AccountQuota(max_concurrent, max_created)

    def _quota_for(self, api_key: str | None) -> AccountQuota | None:
        return self.quotas.get(api_key) or self.quotas.get(None)

    def live_count(self, api_key: str | None) -> int:
        hint = _hint(api_key)
        return sum(
            1
            for r in self.records.values()
            if r.alive and not r.paused and (api_key is None or r.api_key_hint == hint)
        )

    # -- lifecycle --------------------------------------------------------
    async def create(
        self,
        api_key: str | None,
        spec: SandboxSpec,
        *,
        home: str,
        lifetime: float | None = None,
        sandbox_id: str | None = None,
        dirs: tuple[str, ...] = (),
        mounts: Mapping[str, Path] | None = None,
    ) -> GuestSandbox:
        """Admit (quota), create a real local sandbox with the vendor's filesystem
        (``home`` and ``dirs`` in it, ``mounts`` mounted), record it."""
        with self._lock:
            quota = self._quota_for(api_key)
            if quota is not None:
                if quota.max_concurrent is not None:
                    keyed = api_key if api_key in self.quotas else None
                    if self.live_count(keyed) >= quota.max_concurrent:
                        raise QuotaViolation("concurrent", quota.max_concurrent)
                if quota.max_created is not None and quota.created >= quota.max_created:
                    raise QuotaViolation("created", quota.max_created)
                quota.created += 1
        if self.latency is not None:
            await asyncio.sleep(self.latency.sample(self._rng))
        local = await self.local.create(spec, sandbox_id=sandbox_id)
        try:
            sandbox = GuestSandbox(
                local, home, confinement=self.confinement, dirs=dirs, mounts=mounts
            )
        except (OSError, PathRefused):
            await local.kill()
            raise
        now = time.time()
        with self._lock:
            self.sandboxes[sandbox.id] = sandbox
            self.records[sandbox.id] = SandboxRecord(
                id=sandbox.id,
                api_key_hint=_hint(api_key),
                labels=dict(spec.labels),
                created_at=now,
                expires_at=now + lifetime if lifetime else None,
            )
        return sandbox

    async def waking(self) -> None:
        """Take what the vendor takes to resume a paused (stopped, suspended) sandbox:
        a draw from ``resume_latency``, or nothing."""
        if self.resume_latency is not None:
            await asyncio.sleep(self.resume_latency.sample(self._rng))

    def get(self, sandbox_id: str) -> GuestSandbox | None:
        record = self.records.get(sandbox_id)
        if record is None or not record.alive:
            return None
        return self.sandboxes.get(sandbox_id)

    def set_lifetime(self, sandbox_id: str, seconds: float) -> bool:
        record = self.records.get(sandbox_id)
        if record is None or not record.alive:
            return False
        record.expires_at = time.time() + seconds
        return True

    async def kill(self, sandbox_id: str, ended_by: str = "kill") -> bool:
        with self._lock:
            record = self.records.get(sandbox_id)
            if record is None or not record.alive:
                return False
            record.killed_at = time.time()
            record.ended_by = ended_by
            sandbox = self.sandboxes.pop(sandbox_id, None)
        if sandbox is not None:
            await sandbox.kill()
        return True

    def live(self, labels: dict[str, str] | None = None) -> list[SandboxRecord]:
        labels = labels or {}
        return [
            r
            for r in self.records.values()
            if r.alive and all(r.labels.get(k) == v for k, v in labels.items())
        ]

    async def expire(self) -> None:
        now = time.time()
        for record in list(self.records.values()):
            if record.alive and record.expires_at is not None and record.expires_at <= now:
                await self.kill(record.id, "expired")

    async def kill_all(self) -> None:
        for record in list(self.records.values()):
            if record.alive:
                await self.kill(record.id, "shutdown")

    def reset(self) -> None:
        self.faults.clear()
        with self._lock:
            self.quotas.clear()

    def summary(self) -> dict[str, Any]:
        records = [asdict(r) for r in self.records.values()]
        return {
            "emulator": self.name,
            "created": len(records),
            "alive": sum(1 for r in records if r["killed_at"] is None),
            "sandboxes": records,
        }


def _hint(api_key: str | None) -> str:
    """A non-secret tag for a key: records never hold the key itself."""
    if not api_key:
        return "-"
    import hashlib

    return hashlib.sha256(api_key.encode()).hexdigest()[:8]


async def apply_delay_or_hang(fault: FaultSpec) -> None:
    if fault.delay:
        await asyncio.sleep(fault.delay)
    if fault.hang:
        await asyncio.Event().wait()


def http_fault_middleware(
    core: EmulatorCore,
    op_for: Callable[[web.Request], str | None],
    key_for: Callable[[web.Request], str | None],
    error_response: Callable[[FaultSpec], web.StreamResponse],
) -> Any:
    """An aiohttp middleware applying `core.faults` to the requests it names.

    ``op_for`` names the operation of a request (None: never faulted),
    ``error_response`` shapes the vendor's error body for a status fault.
    """

    @web.middleware
    async def middleware(
        request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        op = op_for(request)
        fault = core.faults.take(op, key_for(request)) if op else None
        if fault is None:
            return await handler(request)
        if fault.after:
            # The work completes even when the client gives up waiting, as on a real
            # service; only the answer is late, dropped, or never comes.
            response = await asyncio.shield(handler(request))
            await apply_delay_or_hang(fault)
            if fault.drop:
                _drop(request)
            return response
        await apply_delay_or_hang(fault)
        if fault.drop:
            _drop(request)
        if fault.status is not None:
            return error_response(fault)
        return await handler(request)

    return middleware


def _drop(request: web.Request) -> NoReturn:
    """Close the request's connection without an answer."""
    if request.transport is not None:
        request.transport.abort()
    raise asyncio.CancelledError


def unknown_route_middleware(
    answer: Callable[[web.Request, int, str], web.StreamResponse],
    *,
    skip: Callable[[web.Request], bool] = lambda _: False,
) -> Any:
    """An aiohttp middleware answering a request no route matches as the vendor does.

    ``answer`` shapes the vendor's error (status 404, or 405 for a known path
    with another method) from a message naming the method and path; requests
    ``skip`` names are left to a middleware further in.
    """

    @web.middleware
    async def middleware(
        request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        missing = request.match_info.http_exception
        if missing is None or skip(request):
            return await handler(request)
        response = answer(request, missing.status, f"Cannot {request.method} {request.path}")
        if "Allow" in missing.headers:
            response.headers["Allow"] = missing.headers["Allow"]
        return response

    return middleware


class Emulator(abc.ABC):
    """A provider emulator running on its own loop in a background thread.

    Use as a context manager (``with E2BEmulator() as emu: emu.url``) or call
    `start` / `stop`. ``port=0`` picks a free loopback port. ``isolation``:
    ``auto`` runs the sandboxes' commands under bubblewrap when it is on PATH,
    ``bwrap`` requires it, ``none`` never uses it; without it each command gets
    a mount namespace of its own, or where none can be made runs on the host
    (`emulators.confinement.choose`).
    """

    name: str = "emulator"
    reap_interval = 0.5

    def __init__(
        self,
        *,
        port: int = 0,
        control_port: int = 0,
        host: str = "127.0.0.1",
        root: Path | None = None,
        isolation: str = "auto",
        latency: LatencyProfile | None = None,
        resume_latency: LatencyProfile | None = None,
    ) -> None:
        self.host = host
        self.port = port or free_port()
        self.control_port = control_port or free_port()
        self._tmp = None if root else tempfile.TemporaryDirectory(prefix=f"emu-{self.name}-")
        self.core = EmulatorCore(self.name, root or Path(self._tmp.name), isolation=isolation)  # type: ignore[union-attr]
        # set on start: a vendor's emulator may replace its core
        self._latency, self._resume_latency = latency, resume_latency
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._stop: asyncio.Event | None = None
        self._started = threading.Event()
        self._error: BaseException | None = None

    # -- what a concrete emulator supplies -----------------------------------
    @abc.abstractmethod
    async def serve(self) -> Callable[[], Awaitable[None]]:
        """Start listening on ``self.host:self.port``; return a coroutine fn to stop."""

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def control_url(self) -> str:
        return f"http://{self.host}:{self.control_port}"

    def sdk_env(self) -> dict[str, str]:
        """Environment variables pointing the vendor SDK (and adapter) here."""
        return {}

    def resolve(self, host: str) -> tuple[str, int] | None:
        """Where the vendor's DNS points ``host`` (a wildcard port URL name), or None.

        An emulator whose port URLs are wildcard host names (``8000-<id>.<domain>``)
        serves them on its ingress and says so here; clients connect there and
        keep the name in the ``Host`` header.
        """
        return None

    # -- conveniences for tests -------------------------------------------
    def inject(self, op: str = "*", **kw: Any) -> FaultSpec:
        return self.core.faults.add(FaultSpec(op=op, **kw))

    def clear_faults(self) -> None:
        self.core.faults.clear()

    def set_quota(self, **kw: Any) -> None:
        self.core.set_quota(**kw)

    def set_latency(self, profile: LatencyProfile | None) -> None:
        """Make every create take a draw from ``profile`` (None: as fast as it can)."""
        self.core.latency = profile

    def set_resume_latency(self, profile: LatencyProfile | None) -> None:
        """Make every resume of a paused sandbox take a draw from ``profile``."""
        self.core.resume_latency = profile

    def records(self) -> list[SandboxRecord]:
        return list(self.core.records.values())

    def alive(self) -> list[SandboxRecord]:
        return [r for r in self.core.records.values() if r.alive]

    def call(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run a coroutine on the emulator's loop (from another thread)."""
        assert self._loop is not None
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    # -- running ----------------------------------------------------------
    def start(self) -> Emulator:
        if self._latency is not None:
            self.core.latency = self._latency
        if self._resume_latency is not None:
            self.core.resume_latency = self._resume_latency
        self._thread = threading.Thread(target=self._run, name=f"emulator-{self.name}", daemon=True)
        self._thread.start()
        self._started.wait(30)
        if self._error is not None:
            raise RuntimeError(f"{self.name} emulator failed to start") from self._error
        return self

    def _run(self) -> None:
        """Serve until `stop`; the runner then cancels what still runs on the loop."""
        with asyncio.Runner() as runner:
            self._loop = runner.get_loop()
            try:
                runner.run(self._main())
            except BaseException as exc:
                self._error = exc
                self._started.set()

    async def _main(self) -> None:
        self._stop = asyncio.Event()
        stop_server = await self.serve()
        control = web.AppRunner(self._control_app(), access_log=None)
        await control.setup()
        await web.TCPSite(control, self.host, self.control_port).start()
        reaper = asyncio.create_task(self._reaper())
        self._started.set()
        try:
            await self._stop.wait()
        finally:
            reaper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reaper
            await self.core.kill_all()
            await stop_server()
            await control.cleanup()

    async def _reaper(self) -> None:
        while True:
            await asyncio.sleep(self.reap_interval)
            await self.core.expire()

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None and self._thread is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
            self._thread.join(30)
        if self._tmp is not None:
            self._tmp.cleanup()

    def __enter__(self) -> Emulator:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- control API ------------------------------------------------------
    def _control_app(self) -> web.Application:
        core = self.core

        async def add_fault(request: web.Request) -> web.Response:
            try:
                fault = core.faults.add(FaultSpec(**await request.json()))
            except (TypeError, ValueError) as exc:
                return web.json_response({"error": str(exc)}, status=400)
            return web.json_response(asdict(fault), status=201)

        async def list_faults(_: web.Request) -> web.Response:
            return web.json_response([asdict(f) for f in core.faults.active()])

        async def clear_faults(_: web.Request) -> web.Response:
            core.faults.clear()
            return web.json_response({"cleared": True})

        async def set_quota(request: web.Request) -> web.Response:
            body = await request.json()
            try:
                core.set_quota(
                    body.get("max_concurrent"), body.get("max_created"), body.get("api_key")
                )
            except (TypeError, ValueError) as exc:
                return web.json_response({"error": str(exc)}, status=400)
            return web.json_response({"ok": True})

        async def set_latency(request: web.Request) -> web.Response:
            body = await request.json()
            try:
                profile = LatencyProfile(body["p50_ms"] / 1000, body["p95_ms"] / 1000)
            except (KeyError, TypeError, ValueError) as exc:
                return web.json_response({"error": f"latency: {exc}"}, status=400)
            setattr(core, _LATENCIES[request.match_info.get("phase", "create")], profile)
            return web.json_response({"ok": True})

        async def clear_latency(request: web.Request) -> web.Response:
            setattr(core, _LATENCIES[request.match_info.get("phase", "create")], None)
            return web.json_response({"ok": True})

        async def records(_: web.Request) -> web.Response:
            return web.json_response(core.summary())

        async def reset(_: web.Request) -> web.Response:
            core.reset()
            return web.json_response({"ok": True})

        async def health(_: web.Request) -> web.Response:
            return web.json_response({"emulator": self.name, "url": self.url})

        app = web.Application()
        app.router.add_post("/faults", add_fault)
        app.router.add_get("/faults", list_faults)
        app.router.add_delete("/faults", clear_faults)
        app.router.add_put("/quota", set_quota)
        app.router.add_put("/latency", set_latency)
        app.router.add_delete("/latency", clear_latency)
        app.router.add_put("/latency/{phase:resume}", set_latency)
        app.router.add_delete("/latency/{phase:resume}", clear_latency)
        app.router.add_get("/records", records)
        app.router.add_post("/reset", reset)
        app.router.add_get("/health", health)
        return app
