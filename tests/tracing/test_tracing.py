"""OpenTelemetry spans: a real TracerProvider and the SDK's in-memory exporter, over real
adapters on their emulators (E2B) and ``local``, on the private Redis."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import subprocess
import sys
import threading
import typing
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from emulators import available
from emulators.harness import Emulator
from providers.base import SandboxSpec
from providers.errors import NoProviderAvailable, SandboxError
from router import Router
from router.events import Released, RouterEvent, WarmCreated
from router.spans import AcquireSpan, ReleaseSpan
from router.testing import ScriptedProvider
from router.tracing import RouterTracing, instrument, uninstrument
from tests.polling import wait_until
from tests.providers.test_failover import VENDORS
from tests.router.test_events import sample
from tests.warned import warns

RouterFactory = Callable[..., Router]
SECRET = "sk-live-0123456789abcdef-secret"  # a secret-looking env value
MARK = "marker-7f3a9c"  # in every command's text, nowhere else

needs_e2b = pytest.mark.skipif(not available(["e2b"]), reason="needs the e2b SDK")


@pytest.fixture
def exporter() -> InMemorySpanExporter:
    return InMemorySpanExporter()


@pytest.fixture
def provider(exporter: InMemorySpanExporter) -> Iterator[TracerProvider]:
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield tracer_provider
    tracer_provider.shutdown()


@pytest.fixture
def app(provider: TracerProvider) -> trace.Tracer:
    """The app's own tracer, whose spans the router's must nest under."""
    return provider.get_tracer("the-app")


@pytest.fixture
def local_router(
    redis_url: str, key_prefix: str, tmp_path: Path, new_router: RouterFactory
) -> Callable[..., Router]:
    def make(
        providers: dict[str, ScriptedProvider] | None = None,
        first: dict[str, Any] | None = None,  # the first entry's own settings
        **settings: Any,
    ) -> Router:
        providers = providers or {}
        chain = [{"name": name, "provider": "local"} for name in providers]
        local = {"name": "local", "provider": "local", "options": {"root": str(tmp_path)}}
        chain = [*chain, local]
        chain[0].update(first or {})
        config = {
            "state_url": redis_url,
            "key_prefix": key_prefix,
            "create_timeout": 5,
            "retry": {"attempts": 1},
            "warm_refill_every": 0,
            "chain": chain,
            **settings,
        }
        return new_router(config, providers=providers, hooks=[])

    return make


@pytest.fixture
def e2b_router(
    e2b_emulator: Emulator,
    redis_url: str,
    key_prefix: str,
    tmp_path: Path,
    new_router: RouterFactory,
) -> Iterator[Router]:
    """E2B (its real SDK on the emulator) first, then local."""
    e2b = {
        "name": "e2b",
        "provider": "e2b",
        "options": {**VENDORS["e2b"].options(e2b_emulator), "request_timeout": 2},
    }
    local = {"name": "local", "provider": "local", "options": {"root": str(tmp_path)}}
    config = {
        "state_url": redis_url,
        "key_prefix": key_prefix,
        "create_timeout": 2,
        "retry": {"attempts": 2, "initial": 0.05, "maximum": 0.1},
        "chain": [e2b, local],
    }
    yield new_router(config, hooks=[])
    assert e2b_emulator.alive() == []


def spans(exporter: InMemorySpanExporter) -> dict[str, list[ReadableSpan]]:
    by_name: dict[str, list[ReadableSpan]] = {}
    for span in exporter.get_finished_spans():
        by_name.setdefault(span.name.removeprefix("sandbox_router."), []).append(span)
    return by_name


def parent(span: ReadableSpan) -> int | None:
    return span.parent.span_id if span.parent is not None else None


def span_id(span: ReadableSpan) -> int:
    assert span.context is not None
    return span.context.span_id


def released(exporter: InMemorySpanExporter) -> ReadableSpan:
    """The release span, once its slot's free has landed (it ends then)."""
    for _ in range(100):
        if "release" in spans(exporter):
            return spans(exporter)["release"][0]
        threading.Event().wait(0.05)
    raise AssertionError("the release span never ended")


def everything_recorded(exporter: InMemorySpanExporter) -> str:
    """Every attribute, event attribute and status description of every span, as text."""
    texts = []
    for span in exporter.get_finished_spans():
        texts.append(span.name)
        texts.append(repr(dict(span.attributes or {})))
        texts.append(str(span.status.description))
        for event in span.events:
            texts.append(event.name)
            texts.append(repr(dict(event.attributes or {})))
    return "\n".join(texts)


@needs_e2b
def test_an_acquire_on_e2b_nests_its_attempts_commands_transfers_and_release(
    e2b_router: Router, provider: TracerProvider, exporter: InMemorySpanExporter, app: Any
) -> None:
    instrument(e2b_router, provider)
    with app.start_as_current_span("request") as request, e2b_router.acquire() as lease:
        assert lease.sandbox.run("echo hi").exit_code == 0
        assert lease.sandbox.run("exit 3").exit_code == 3  # a result, not an error
        lease.sandbox.write_file("in.bin", b"\x00\x01\x02")
        assert lease.sandbox.read_file("in.bin") == b"\x00\x01\x02"
    release = released(exporter)
    made = spans(exporter)
    mine = request.get_span_context().span_id
    [acquire] = made["acquire"]
    assert parent(acquire) == mine
    assert {name: len(made[name]) for name in ("reserve", "create")} == {"reserve": 1, "create": 1}
    for attempt in (made["reserve"][0], made["create"][0]):
        assert parent(attempt) == span_id(acquire)
        assert attempt.attributes is not None
        assert attempt.attributes["sandbox_router.entry"] == "e2b"
        assert attempt.attributes["sandbox_router.provider"] == "e2b"
    assert made["create"][0].attributes is not None
    assert made["create"][0].attributes["sandbox_router.outcome"] == "created"
    assert acquire.attributes is not None
    assert acquire.attributes["sandbox_router.entry"] == "e2b"
    assert acquire.attributes["sandbox_router.outcome"] == "success"
    assert acquire.attributes["sandbox_router.lease_id"] == lease.id
    assert acquire.attributes["sandbox_router.failovers"] == 0
    for name in ("run", "write_file", "read_file", "release"):
        assert all(parent(span) == mine for span in made[name]), name
    assert [s.attributes["process.exit.code"] for s in made["run"] if s.attributes] == [0, 3]
    assert all(s.status.status_code is StatusCode.UNSET for s in made["run"])
    assert made["read_file"][0].attributes is not None
    assert made["read_file"][0].attributes["file.size"] == 3
    assert release.attributes is not None
    assert release.attributes["sandbox_router.lease_id"] == lease.id
    assert release.attributes["sandbox_router.seconds"] > 0
    assert isinstance(release.attributes["sandbox_router.cost_usd"], float)


@needs_e2b
def test_a_failover_shows_on_the_attempts_with_its_reason(
    e2b_router: Router,
    e2b_emulator: Emulator,
    provider: TracerProvider,
    exporter: InMemorySpanExporter,
) -> None:
    e2b_emulator.inject("create", status=503, times=None)
    instrument(e2b_router, provider)
    with e2b_router.acquire() as lease:
        assert (lease.entry, lease.failovers) == ("local", ["e2b"])
    made = spans(exporter)
    [acquire] = made["acquire"]
    creates: dict[object, list[ReadableSpan]] = {}
    for span in made["create"]:
        creates.setdefault((span.attributes or {})["sandbox_router.entry"], []).append(span)
    assert len(creates["e2b"]) == 2  # the router tries a transient error twice
    for failed in creates["e2b"]:
        assert parent(failed) == span_id(acquire)
        assert failed.status.status_code is StatusCode.ERROR
        assert failed.attributes is not None
        assert failed.attributes["error.type"] == "Unavailable"
        assert failed.attributes["sandbox_router.reason"] == "unavailable"
        assert failed.attributes["sandbox_router.outcome"] == "error"
        [exception] = [e for e in failed.events if e.name == "exception"]
        assert exception.attributes is not None
        assert exception.attributes["exception.type"] == "Unavailable"
    assert [(s.attributes or {})["sandbox_router.outcome"] for s in creates["local"]] == ["created"]
    [failover] = [e for e in acquire.events if e.name == "sandbox_router.failover"]
    assert dict(failover.attributes or {}) == {
        "sandbox_router.from_entry": "e2b",
        "sandbox_router.to_entry": "local",
        "sandbox_router.reason": "unavailable",
    }
    assert acquire.attributes is not None
    assert acquire.attributes["sandbox_router.entry"] == "local"
    assert acquire.attributes["sandbox_router.failovers"] == 1
    assert acquire.status.status_code is StatusCode.UNSET


def test_a_hedge_is_a_span_of_its_own_and_the_slow_create_ends_when_it_answers(
    local_router: Callable[..., Router],
    tmp_path: Path,
    provider: TracerProvider,
    exporter: InMemorySpanExporter,
) -> None:
    gate = threading.Event()
    slow = ScriptedProvider("slow", tmp_path, [gate])
    router = local_router({"slow": slow}, first={"hedge": {"after": 0.2}})
    instrument(router, provider)
    try:
        with router.acquire() as lease:
            assert lease.entry == "local"
        [acquire] = spans(exporter)["acquire"]
        [hedge] = spans(exporter)["hedge"]
        assert "create" not in spans(exporter)  # the slow create is still under way
    finally:
        gate.set()
    wait_until(lambda: "create" in spans(exporter))
    [create] = spans(exporter)["create"]
    assert parent(hedge) == parent(create) == span_id(acquire)
    assert (hedge.attributes or {})["sandbox_router.entry"] == "local"
    assert (create.attributes or {})["sandbox_router.entry"] == "slow"
    assert (create.attributes or {})["sandbox_router.outcome"] == "created"
    named = {e.name: dict(e.attributes or {}) for e in acquire.events}
    assert named["sandbox_router.hedge_settled"]["sandbox_router.winner"] == "local"
    assert "sandbox_router.hedge_started" in named


def test_a_warm_claim_is_an_attempt_and_the_refill_joins_no_trace(
    local_router: Callable[..., Router],
    provider: TracerProvider,
    exporter: InMemorySpanExporter,
    app: Any,
) -> None:
    router = local_router(first={"warm": {"size": 1}}, warm_refill_every=0.05)
    instrument(router, provider)
    refilled: list[int] = []  # the trace each refill ran in (0: none)

    def seen(event: RouterEvent) -> None:
        if isinstance(event, WarmCreated):
            refilled.append(trace.get_current_span().get_span_context().trace_id)

    router.hooks.append(seen)
    with app.start_as_current_span("first"):
        router.acquire().release()  # a miss, which starts the refill loop
    wait_until(lambda: router.warm_ready() == {"local": 1})
    exporter.clear()
    with app.start_as_current_span("second"), router.acquire() as lease:
        assert lease.sandbox.run("true").exit_code == 0
    made = spans(exporter)
    [claim] = made["warm_claim"]
    assert (claim.attributes or {})["sandbox_router.outcome"] == "claimed"
    assert (claim.attributes or {})["sandbox_router.sandbox_id"] == lease.sandbox_id
    assert "create" not in made
    assert refilled
    assert set(refilled) == {0}  # the loop the first acquire started is in no trace


def test_a_dropped_lease_is_released_outside_the_collecting_threads_trace(
    local_router: Callable[..., Router],
    provider: TracerProvider,
    exporter: InMemorySpanExporter,
    app: Any,
) -> None:
    router = local_router()
    instrument(router, provider)
    lease = router.acquire()
    # warned of inside the block: an automatic collection may come before gc.collect()
    with app.start_as_current_span("unrelated"), warns(ResourceWarning, "never released"):
        del lease
        gc.collect()
    assert parent(released(exporter)) is None


def test_nothing_to_serve_is_an_error_on_the_acquire_span(
    local_router: Callable[..., Router], provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    router = local_router()
    instrument(router, provider)
    with pytest.raises(NoProviderAvailable):
        router.acquire(requires=("no-such-capability",))
    [acquire] = spans(exporter)["acquire"]
    assert acquire.status.status_code is StatusCode.ERROR
    assert acquire.attributes is not None
    assert acquire.attributes["error.type"] == "NoProviderAvailable"
    assert acquire.attributes["sandbox_router.outcome"] == "no_provider"
    assert acquire.attributes["sandbox_router.requires"] == ("no-such-capability",)
    [exception] = [e for e in acquire.events if e.name == "exception"]
    assert exception.attributes is not None
    assert exception.attributes["exception.type"] == "NoProviderAvailable"


def test_a_failed_transfer_is_an_error_on_its_span(
    local_router: Callable[..., Router], provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    router = local_router()
    instrument(router, provider)
    with router.acquire() as lease, pytest.raises(SandboxError):
        lease.sandbox.read_file("no/such/file")
    [read] = spans(exporter)["read_file"]
    assert read.status.status_code is StatusCode.ERROR
    assert read.attributes is not None
    assert read.attributes["error.type"] == "SandboxError"


@pytest.mark.parametrize("own_loop", [False, True], ids=["router-thread", "app-loop"])
async def test_the_async_api_nests_under_the_apps_span(
    local_router: Callable[..., Router],
    provider: TracerProvider,
    exporter: InMemorySpanExporter,
    app: Any,
    own_loop: bool,
) -> None:
    router = local_router()
    if own_loop:
        await router.__aenter__()  # calls run in place on this loop
    instrument(router, provider)

    async def step(name: str) -> int:
        with app.start_as_current_span(name) as mine:
            async with router.aacquire() as lease:
                await lease.sandbox.run("true")
                await lease.sandbox.run_code("1 + 1")
                process = await lease.sandbox.start(["sleep", "0"])
                await process.wait()
                await lease.sandbox.write_file("f.txt", "text")
        return int(mine.get_span_context().span_id)

    firsts = await asyncio.gather(step("one"), step("two"))  # two at once: each its own
    made = spans(exporter)
    for name in ("acquire", "run", "run_code", "start", "write_file"):
        assert sorted(parent(s) or 0 for s in made[name]) == sorted(firsts), name
    for name in ("reserve", "create"):
        acquires = {span_id(s) for s in made["acquire"]}
        assert {parent(s) for s in made[name]} == acquires, name
    start = made["start"][0].attributes
    assert start is not None
    assert start["sandbox_router.process_id"]
    if own_loop:
        await router.aclose()


def test_no_secret_env_value_or_command_text_by_default(
    local_router: Callable[..., Router],
    tmp_path: Path,
    provider: TracerProvider,
    exporter: InMemorySpanExporter,
) -> None:
    router = local_router()
    instrument(router, provider)
    spec = SandboxSpec(env={"API_TOKEN": SECRET})
    session = f"user-{MARK}"
    try:
        with router.acquire(spec, session=session) as lease:
            box = lease.sandbox
            assert box.run(f"echo {MARK} $API_TOKEN", env={"OTHER": SECRET}).exit_code == 0
            box.run(["echo", MARK], env={"OTHER": SECRET})
            box.run(f"sleep 5 # {MARK}", timeout=0.2)
            box.run_code(f"print('{MARK}')", env={"OTHER": SECRET})
            box.start(f"echo {MARK}", env={"OTHER": SECRET}).wait()
            box.write_file(f"{MARK}.txt", SECRET)
            box.read_file(f"{MARK}.txt")
            local = tmp_path / "upload.txt"
            local.write_text(SECRET)
            box.upload_file(local, f"{MARK}-up.txt")
            with pytest.raises(SandboxError):
                box.read_file(f"missing/{MARK}")
        released(exporter)
        names = {span.name for span in exporter.get_finished_spans()}
        assert {"run", "run_code", "start", "write_file", "upload_file"} <= {
            name.removeprefix("sandbox_router.") for name in names
        }
        recorded = everything_recorded(exporter)
        assert SECRET not in recorded
        assert MARK not in recorded
    finally:
        router.close_session(session)  # a released session's sandbox outlives its router


def test_record_commands_and_paths_when_the_app_asks(
    local_router: Callable[..., Router], provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    router = local_router()
    instrument(router, provider, record_commands=True, record_paths=True)
    with router.acquire(SandboxSpec(env={"API_TOKEN": SECRET})) as lease:
        lease.sandbox.run(f"echo {MARK}", env={"OTHER": SECRET})
        lease.sandbox.run(["echo", MARK, "two words"])
        lease.sandbox.run_code(f"x = '{MARK}'")
        lease.sandbox.write_file("kept.txt", b"data")
    made = spans(exporter)
    lines = [(s.attributes or {})["process.command_line"] for s in made["run"]]
    assert lines == [f"echo {MARK}", f"echo {MARK} 'two words'"]
    assert (made["run"][1].attributes or {})["process.command_args"] == ("echo", MARK, "two words")
    assert (made["run_code"][0].attributes or {})["sandbox_router.code"] == f"x = '{MARK}'"
    assert (made["write_file"][0].attributes or {})["file.path"] == "kept.txt"
    assert SECRET not in everything_recorded(exporter)  # env values never, even then


def test_the_hook_takes_every_event_inside_a_span_and_outside(
    local_router: Callable[..., Router], provider: TracerProvider
) -> None:
    router = local_router()
    tracing = instrument(router, provider)
    events = typing.get_args(RouterEvent)
    for cls in events:
        tracing.hook(sample(cls))
    for record in (AcquireSpan(), ReleaseSpan("local", "x", "sandbox")):
        with tracing.tracer(record):
            for cls in events:
                tracing.hook(sample(cls))
    tracing.close()


def test_a_release_span_ends_when_its_slot_is_freed_whichever_comes_first(
    local_router: Callable[..., Router], provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    tracing = instrument(local_router(), provider)
    with tracing.tracer(ReleaseSpan("local", "early", "s1")):
        tracing.hook(Released("local", "early", 2.0, 0.5, "local"))  # freed before the kill
    with tracing.tracer(ReleaseSpan("local", "late", "s2")):
        pass
    assert [s.name for s in exporter.get_finished_spans()] == ["sandbox_router.release"]
    tracing.hook(Released("local", "late", 3.0, 0.75, "local"))
    ends = {
        (s.attributes or {})["sandbox_router.lease_id"]: (s.attributes or {})
        for s in exporter.get_finished_spans()
    }
    assert ends["early"]["sandbox_router.cost_usd"] == 0.5
    assert ends["late"]["sandbox_router.cost_usd"] == 0.75
    assert ends["late"]["sandbox_router.seconds"] == 3.0


def test_a_broken_tracer_breaks_no_acquire(
    local_router: Callable[..., Router], caplog: pytest.LogCaptureFixture
) -> None:
    router = local_router()

    def broken(span: object) -> typing.ContextManager[None]:
        raise RuntimeError("tracer bug")

    router.tracers.append(broken)
    with router.acquire() as lease:
        assert lease.sandbox.run("echo ok").stdout == "ok\n"
    assert any("tracer_failed" in r.getMessage() for r in caplog.records)


def test_uninstrument_removes_the_hook_and_the_tracer(
    local_router: Callable[..., Router], provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    router = local_router()
    first = instrument(router, provider)
    second = instrument(router, provider)  # again: replaces the first
    assert isinstance(second, RouterTracing)
    assert (router.hooks, router.tracers) == ([second.hook], [second.tracer])
    assert first.hook not in router.hooks
    uninstrument(router)
    assert (router.hooks, router.tracers) == ([], [])
    router.acquire().release()
    assert exporter.get_finished_spans() == ()


def test_a_router_without_tracing_imports_no_opentelemetry(tmp_path: Path) -> None:
    script = f"""
import sys
from router import Router
config = {{"state_url": "memory://", "chain": [
    {{"name": "local", "provider": "local", "options": {{"root": {str(tmp_path)!r}}}}}]}}
with Router.from_config(config, hooks=[]) as router, router.acquire() as lease:
    lease.sandbox.run("true")
    lease.sandbox.write_file("f", b"x")
loaded = sorted(m for m in sys.modules if m.startswith("opentelemetry"))
assert not loaded, loaded
"""
    env = {**os.environ, "PYTHONPATH": str(Path.cwd())}
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr


def test_streams_and_waits_are_spans_of_the_apps(
    local_router: Callable[..., Router],
    provider: TracerProvider,
    exporter: InMemorySpanExporter,
    app: Any,
) -> None:
    """A stream's span lasts its iteration (never current: the loop body's spans are the
    app's children); a process's wait is a command span with its end."""
    router = local_router()
    instrument(router, provider)
    with app.start_as_current_span("request") as request, router.acquire() as lease:
        box = lease.sandbox
        box.write_file("data.bin", b"x" * 1000)
        chunks = []
        for chunk in box.stream(f"printf 'ab'; printf 'cde' >&2 # {MARK}"):
            chunks.append(chunk)
            with app.start_as_current_span("body"):
                pass
        assert box.read_file("data.bin") == b"".join(box.read_stream("data.bin"))
        with contextlib.closing(box.stream("yes")) as endless:
            next(endless)  # left early: the command is killed
        assert box.start("exit 4").wait().exit_code == 4
        assert box.start("sleep 5").wait(timeout=0.2).timed_out
        with pytest.raises(SandboxError):
            list(box.read_stream(f"missing/{MARK}"))
    made = spans(exporter)
    mine = request.get_span_context().span_id
    whole, early = made["stream"]
    for span in (whole, early, *made["read_stream"], *made["wait"]):
        assert parent(span) == mine, span.name
        assert (span.attributes or {})["sandbox_router.entry"] == "local"
        assert (span.attributes or {})["sandbox_router.sandbox_id"] == lease.sandbox_id
    assert {parent(s) for s in made["body"]} == {mine}
    assert (whole.attributes or {})["sandbox_router.chunks"] == len(chunks)
    assert (whole.attributes or {})["sandbox_router.output.size"] == 5
    assert (whole.attributes or {})["sandbox_router.outcome"] == "success"
    assert (early.attributes or {})["sandbox_router.outcome"] == "closed"
    assert early.status.status_code is StatusCode.UNSET
    read, missing = made["read_stream"]
    assert (read.attributes or {})["file.size"] == 1000
    assert (read.attributes or {})["sandbox_router.chunks"] >= 1
    assert missing.status.status_code is StatusCode.ERROR
    assert (missing.attributes or {})["error.type"] == "SandboxError"
    ended, timed_out = made["wait"]
    assert (ended.attributes or {})["process.exit.code"] == 4
    assert (ended.attributes or {})["sandbox_router.process_id"]
    assert (timed_out.attributes or {})["sandbox_router.timed_out"] is True
    assert MARK not in everything_recorded(exporter)  # no command text, no path


async def test_async_streams_and_waits_nest_under_the_apps_span(
    local_router: Callable[..., Router],
    provider: TracerProvider,
    exporter: InMemorySpanExporter,
    app: Any,
) -> None:
    router = local_router()
    instrument(router, provider, record_commands=True, record_paths=True)
    with app.start_as_current_span("request") as request:
        async with router.aacquire() as lease:
            await lease.sandbox.write_file("f.txt", "hello")
            assert [c.data async for c in lease.sandbox.stream(["echo", MARK])] == [f"{MARK}\n"]
            assert b"".join([c async for c in lease.sandbox.read_stream("f.txt")]) == b"hello"
            process = await lease.sandbox.start("exit 2")
            assert (await process.wait()).exit_code == 2
    made = spans(exporter)
    mine = request.get_span_context().span_id
    [stream], [read], [wait] = made["stream"], made["read_stream"], made["wait"]
    assert {parent(stream), parent(read), parent(wait)} == {mine}
    assert (stream.attributes or {})["process.command_line"] == f"echo {MARK}"
    assert (read.attributes or {})["file.path"] == "f.txt"
    assert (read.attributes or {})["file.size"] == 5
    assert "process.command_line" not in (wait.attributes or {})  # a wait knows no command
