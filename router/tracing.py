"""OpenTelemetry spans for a router (the optional ``tracing`` extra).

``instrument(router, tracer_provider=...)`` installs one `RouterTracing`: a
tracer (``router.tracers``, `router.spans`) that opens a span per operation,
and an event hook (``router.hooks``) that puts the events an operation emits
on its open span. Each span is a child of the span current where the call
was made: the app's, carried to the router's loop with the call's context
(``router.engine``), sync and async APIs alike. Nothing here is imported
unless the app imports it: a router without tracing imports no OpenTelemetry.

The spans (``sandbox_router.<operation>``)::

    acquire (or resume)          an acquire, to its lease or its error
      reserve                    the ledger's grant or denial, per entry tried
      warm_claim                 connecting to a warm sandbox
      create / hedge             a provider's create (a hedge: a spare entry's beside
                                 a slow one), in its own task, until the provider answers
    run / run_code / start       a command in a lease's sandbox
    wait                         a background process's end, waited for
    stream / read_stream         an iteration over a command's output or a file's bytes,
                                 from its first pull to its end (never the current span)
    read_file / write_file ...   a file transfer
    release                      a lease's end, until its slot is freed (its cost)

Attributes follow the OpenTelemetry conventions where they fit: ``error.type``
and an ``exception`` event (the router's error class names, the error's
message with URL passwords masked) on a failed operation, whose status is
ERROR; ``process.exit.code``; ``file.size``. The GenAI conventions define no
sandbox operation (their ``execute_tool`` span is the agent framework's, and
a command runs under it); what the router follows from them is their rule on
content: a command's text (``process.command_line``, ``process.command_args``,
``sandbox_router.code``) is recorded only with ``record_commands=True``, a
path (``file.path``) only with ``record_paths=True``. An env value, a secret
or a session key is never recorded. The rest is ``sandbox_router.*``: entry,
provider (its kind), outcome, reason (why an attempt failed or was denied:
``unavailable``, ``rate_limited``, ``quota``...), attempt, lease and sandbox
ids, failovers, and a release's metered ``seconds`` and ``cost_usd``.
"""

from __future__ import annotations

import asyncio
import contextvars
import shlex
import traceback
import weakref
from collections.abc import Sequence
from types import TracebackType
from typing import TYPE_CHECKING, assert_never

from opentelemetry import context, trace
from opentelemetry.trace import Span, SpanKind, Status, StatusCode
from opentelemetry.util.types import AttributeValue

from policies.outcome import classify
from providers.logs import redact_secrets
from router.booking import Denied
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
from router.spans import (
    AcquireSpan,
    AttemptSpan,
    CommandSpan,
    ReleaseSpan,
    RouterSpan,
    StreamSpan,
    TransferSpan,
)

if TYPE_CHECKING:
    from opentelemetry.trace import TracerProvider

    from router.core import Router

__all__ = ["SCOPE", "RouterTracing", "instrument", "uninstrument"]

SCOPE = "sandbox_router"  # the instrumentation scope's name, and every span's prefix

ENTRY = "sandbox_router.entry"
PROVIDER = "sandbox_router.provider"
OUTCOME = "sandbox_router.outcome"
REASON = "sandbox_router.reason"
ATTEMPT = "sandbox_router.attempt"
LEASE = "sandbox_router.lease_id"
SANDBOX = "sandbox_router.sandbox_id"
CODE = "sandbox_router.code"
ERROR_TYPE = "error.type"
EXIT_CODE = "process.exit.code"
COMMAND_LINE = "process.command_line"
COMMAND_ARGS = "process.command_args"
FILE_PATH = "file.path"
FILE_SIZE = "file.size"
CHUNKS = "sandbox_router.chunks"
OUTPUT_CHARS = "sandbox_router.output.size"

Attributes = dict[str, AttributeValue]

# The open span of the operation running in this context, for the events it emits.
_OPEN: contextvars.ContextVar[_Scope | None] = contextvars.ContextVar(
    "sandbox_router_span", default=None
)


class RouterTracing:
    """One router's OpenTelemetry instrumentation: `tracer` opens the spans, `hook`
    annotates them. Made by `instrument`."""

    def __init__(
        self,
        router: Router,
        tracer: trace.Tracer,
        *,
        record_commands: bool = False,
        record_paths: bool = False,
    ) -> None:
        self._tracer = tracer
        self._kinds = {name: router.provider(name).kind for name in router.entries}
        self.record_commands = record_commands
        self.record_paths = record_paths
        # releases whose span waits for their slot's free (`Released`), by lease id
        self._releasing: dict[str, _Scope] = {}

    def tracer(self, span: RouterSpan) -> _Scope:
        """The router's tracer (`router.spans.Tracer`): one OpenTelemetry span per record."""
        return _Scope(self, span)

    def hook(self, event: RouterEvent) -> None:
        """The router's event hook: an event on the span of the operation that emitted it."""
        scope = _OPEN.get()
        if scope is not None and (scope.owner is not self or not scope.span.is_recording()):
            scope = None  # another router's, or one that ended (a task started in it)
        acquire = scope if scope is not None and isinstance(scope.record, AcquireSpan) else None
        claim = scope if scope is not None and _claiming(scope.record) else None
        match event:
            case Acquired() | Resumed():
                if acquire is not None:
                    self._acquired(acquire, event)
            case AcquireFailed():
                if acquire is not None:
                    acquire.outcome = "no_provider"
            case Failover() | HedgeStarted() | HedgeSettled() | WarmMissed():
                if acquire is not None:
                    acquire.span.add_event(f"{SCOPE}.{event.name}", _event_attributes(event))
            case SessionHeld(entry=entry) | SessionLost(entry=entry):  # not the session key
                if acquire is not None:
                    acquire.span.add_event(f"{SCOPE}.{event.name}", {ENTRY: entry})
            case WarmClaimed():
                if claim is not None:
                    claim.outcome = "claimed"
                    claim.span.set_attributes(
                        {
                            LEASE: event.lease_id,
                            SANDBOX: event.sandbox_id,
                            "sandbox_router.warm.idle": event.idle,
                            "sandbox_router.warm.paused": event.paused,
                        }
                    )
            case WarmKilled(reason=reason):
                if claim is not None:
                    claim.outcome, claim.reason = "failed", reason
            case Released():
                self._released(event)
            case FreesOwed():
                self.close("free_owed")
            case (
                Created()
                | CreateFailed()
                | LateCreate()
                | Refund()
                | BreakerTransition()
                | LeaseLost()
                | KillFailed()
                | KillAbandoned()
                | StateError()
                | TaskFailed()
                | StateWarning()
                | SessionClosed()
                | Paused()
                | Reaped()
                | QuotaChanged()
                | OutageHandedOver()
                | WarmCreated()
                | WarmSized()
                | BudgetExhausted()
            ):
                pass  # the spans of the operations they come from say it, or none is open
            case _:
                assert_never(event)

    def close(self, outcome: str = "unfinished") -> None:
        """End the release spans still waiting for their slot's free."""
        while self._releasing:
            _, scope = self._releasing.popitem()
            scope.span.set_attribute(OUTCOME, outcome)
            scope.span.end()

    # -- the spans ---------------------------------------------------------------------
    def _start(self, record: RouterSpan) -> Span:
        """The span of ``record``, a child of the current one, with what is known now."""
        attributes: Attributes
        kind = SpanKind.CLIENT
        match record:
            case AcquireSpan(requires=requires, session=session, resume=resume):
                name, kind = ("resume" if resume else "acquire"), SpanKind.INTERNAL
                attributes = {"sandbox_router.requires": list(requires)}
                if session:
                    attributes["sandbox_router.session"] = True
            case AttemptSpan(phase=phase, entry=entry, attempt=attempt):
                name = phase
                if phase in ("reserve", "warm_claim"):
                    kind = SpanKind.INTERNAL
                attributes = {**self._where(entry), ATTEMPT: attempt}
            case CommandSpan(call=call, entry=entry, sandbox_id=sandbox_id, command=command):
                name = call
                attributes = {**self._where(entry), SANDBOX: sandbox_id}
                if self.record_commands:
                    attributes.update(_command(call, command))
            case TransferSpan(call=call, entry=entry, sandbox_id=sandbox_id, path=path):
                name = call
                attributes = {**self._where(entry), SANDBOX: sandbox_id}
                if self.record_paths:
                    attributes[FILE_PATH] = path
            case ReleaseSpan(entry=entry, lease_id=lease_id, sandbox_id=sandbox_id):
                name, kind = "release", SpanKind.INTERNAL
                attributes = {**self._where(entry), LEASE: lease_id, SANDBOX: sandbox_id}
            case StreamSpan(call=call, entry=entry, sandbox_id=sandbox_id, source=source):
                name = call
                attributes = {**self._where(entry), SANDBOX: sandbox_id}
                if call == "stream" and self.record_commands:
                    attributes.update(_command(call, source))
                elif call == "read_stream" and self.record_paths and isinstance(source, str):
                    attributes[FILE_PATH] = source
            case _:
                assert_never(record)
        return self._tracer.start_span(f"{SCOPE}.{name}", kind=kind, attributes=attributes)

    def _end(self, scope: _Scope, exc: BaseException | None) -> None:
        """Put what the operation ended with on its span, and end it (a release's waits
        for its slot's free)."""
        span, record = scope.span, scope.record
        ended: Attributes = {}
        match record:
            case CommandSpan(exit_code=exit_code, timed_out=timed_out, process_id=process_id):
                if exit_code is not None:
                    ended[EXIT_CODE] = exit_code
                if timed_out:
                    ended["sandbox_router.timed_out"] = True
                if process_id is not None:
                    ended["sandbox_router.process_id"] = process_id
            case TransferSpan(size=size):
                if size is not None:
                    ended[FILE_SIZE] = size
            case StreamSpan(call=call, chunks=chunks, size=size):
                ended[CHUNKS] = chunks
                ended[FILE_SIZE if call == "read_stream" else OUTPUT_CHARS] = size
            case AcquireSpan() | AttemptSpan() | ReleaseSpan():
                pass
            case _:
                assert_never(record)
        if exc is None:
            scope.outcome = scope.outcome or _success(record)
        elif isinstance(exc, GeneratorExit):  # the app left a stream's loop early
            scope.outcome = "closed"
        elif isinstance(exc, Denied):  # the entry is skipped: no error of the acquire's
            scope.outcome = "denied"
            scope.reason = exc.reservation.reason
            if exc.reservation.unit:
                ended["sandbox_router.quota.unit"] = exc.reservation.unit
        elif isinstance(exc, asyncio.CancelledError):
            scope.outcome = "cancelled"
        else:
            scope.outcome = scope.outcome or "error"
            if isinstance(record, AttemptSpan):
                scope.reason = scope.reason or classify(exc).reason
            _failed(span, exc, self._unrecorded(record))
        ended[OUTCOME] = scope.outcome
        if scope.reason is not None:
            ended[REASON] = scope.reason
        span.set_attributes(ended)  # one call: each takes the span's lock
        if isinstance(record, ReleaseSpan):
            scope.exited = True
            if exc is None and not scope.freed:
                return  # its slot's free (`Released`) ends it, or `close`
            self._releasing.pop(record.lease_id, None)
        span.end()

    def _acquired(self, scope: _Scope, event: Acquired | Resumed) -> None:
        attributes: Attributes = {
            **self._where(event.entry),
            LEASE: event.lease_id,
            SANDBOX: event.sandbox_id,
        }
        if isinstance(event, Acquired):
            attributes["sandbox_router.attempts"] = event.attempts
            attributes["sandbox_router.failovers"] = event.failovers
        scope.span.set_attributes(attributes)
        resumed = isinstance(event, Resumed) or event.resumed
        scope.outcome = "resumed" if resumed else "success"

    def _released(self, event: Released) -> None:
        scope = self._releasing.get(event.lease_id)
        if scope is None:
            return
        attributes: Attributes = {"sandbox_router.pool": event.pool}
        if event.seconds is not None:
            attributes["sandbox_router.seconds"] = event.seconds
        if event.cost is not None:
            attributes["sandbox_router.cost_usd"] = event.cost
        scope.span.set_attributes(attributes)
        if scope.exited:
            del self._releasing[event.lease_id]
            scope.span.end()
        else:
            scope.freed = True

    def _unrecorded(self, record: RouterSpan) -> tuple[str, ...]:
        """What of ``record`` stays off its span, masked in its error's message too (a
        provider's error may quote the command or the path)."""
        match record:
            case CommandSpan(command=command) if not self.record_commands:
                return _texts(command)
            case TransferSpan(path=path) if not self.record_paths:
                return (path,)
            case StreamSpan(call="stream", source=source) if not self.record_commands:
                return _texts(source)
            case StreamSpan(call="read_stream", source=source) if not self.record_paths:
                return _texts(source)
            case _:
                return ()

    def _where(self, entry: str) -> Attributes:
        return {ENTRY: entry, PROVIDER: self._kinds.get(entry, "")}


class _Scope:
    """One open span: entered where its operation starts, exited where it ends."""

    __slots__ = (
        "_attached",
        "_mine",
        "exited",
        "freed",
        "outcome",
        "owner",
        "reason",
        "record",
        "span",
    )

    def __init__(self, owner: RouterTracing, record: RouterSpan) -> None:
        self.owner = owner
        self.record = record
        self.outcome: str | None = None
        self.reason: str | None = None
        self.exited = False
        self.freed = False

    def __enter__(self) -> None:
        self.span = self.owner._start(self.record)
        if isinstance(self.record, StreamSpan):
            return  # held over an iteration, maybe ended in another context: never current
        self._attached = context.attach(trace.set_span_in_context(self.span))
        self._mine = _OPEN.set(self)
        if isinstance(self.record, ReleaseSpan):
            self.owner._releasing[self.record.lease_id] = self

    def __exit__(
        self,
        typ: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if not isinstance(self.record, StreamSpan):
            _OPEN.reset(self._mine)
            context.detach(self._attached)
        self.owner._end(self, exc)


def _claiming(record: RouterSpan) -> bool:
    return isinstance(record, AttemptSpan) and record.phase == "warm_claim"


def _success(record: RouterSpan) -> str:
    match record:
        case AttemptSpan(phase="reserve"):
            return "granted"
        case AttemptSpan(phase="warm_claim"):
            return "failed"  # a claim that connected said so (`WarmClaimed`)
        case AttemptSpan():
            return "created"
        case AcquireSpan() | CommandSpan() | TransferSpan() | ReleaseSpan() | StreamSpan():
            return "success"
        case _:
            assert_never(record)


def _texts(command: str | Sequence[str]) -> tuple[str, ...]:
    """The forms a command's (or a path's) text takes in an error message."""
    if isinstance(command, str):
        return (command,)
    return (shlex.join(command), " ".join(command))


def _command(call: str, command: str | Sequence[str]) -> Attributes:
    """A command's text, recorded only when the app opted in (none for a ``wait``, which
    does not know it)."""
    if not command:
        return {}
    if isinstance(command, str):
        return {CODE if call == "run_code" else COMMAND_LINE: command}
    argv = list(command)
    return {COMMAND_LINE: shlex.join(argv), COMMAND_ARGS: argv}


def _event_attributes(event: RouterEvent) -> Attributes:
    """An event's fields as span-event attributes (only the events put on an acquire's
    span, whose fields are names, reasons and numbers)."""
    return {
        f"{SCOPE}.{key}": value
        for key, value in event.fields.items()
        if isinstance(value, str | bool | int | float)
    }


def _masked(text: str, unrecorded: tuple[str, ...]) -> str:
    for hidden in unrecorded:
        if hidden:
            text = text.replace(hidden, "***")
    return str(redact_secrets(None, "", {"text": text})["text"])


def _failed(span: Span, exc: BaseException, unrecorded: tuple[str, ...]) -> None:
    """The operation's error on its span: status ERROR, ``error.type``, an ``exception``
    event (its message and stack, URL passwords and the ``unrecorded`` text masked)."""
    name = type(exc).__name__
    message = _masked(str(exc), unrecorded)
    span.set_attribute(ERROR_TYPE, name)
    span.set_status(Status(StatusCode.ERROR, f"{name}: {message}"))
    stack = _masked("".join(traceback.format_exception(exc)), unrecorded)
    span.add_event(
        "exception",
        {
            "exception.type": name,
            "exception.message": message,
            "exception.stacktrace": stack,
            "exception.escaped": True,
        },
    )


_INSTRUMENTED: weakref.WeakKeyDictionary[Router, RouterTracing] = weakref.WeakKeyDictionary()


def instrument(
    router: Router,
    tracer_provider: TracerProvider | None = None,
    *,
    record_commands: bool = False,
    record_paths: bool = False,
) -> RouterTracing:
    """Trace ``router``'s operations into ``tracer_provider`` (default: the global one).

    ``record_commands``: put each command's text (and a ``run_code`` cell's
    code) on its span; ``record_paths``: each transfer's sandbox path. Both off
    by default: a command line may carry what should not leave the app. Again
    on the same router replaces the previous instrumentation.
    """
    uninstrument(router)
    tracer = trace.get_tracer(SCOPE, tracer_provider=tracer_provider)
    tracing = RouterTracing(
        router, tracer, record_commands=record_commands, record_paths=record_paths
    )
    router.hooks.append(tracing.hook)
    router.tracers.append(tracing.tracer)
    _INSTRUMENTED[router] = tracing
    return tracing


def uninstrument(router: Router) -> None:
    """Stop tracing ``router`` (what `instrument` installed is removed)."""
    tracing = _INSTRUMENTED.pop(router, None)
    if tracing is None:
        return
    router.hooks[:] = [hook for hook in router.hooks if hook != tracing.hook]
    router.tracers[:] = [tracer for tracer in router.tracers if tracer != tracing.tracer]
    tracing.close()
