"""Spans as hooks: the router's timed operations, each wrapped by the app's tracers.

Events (`router.events`) say that something happened. Some operations also
last, and have a place in the app's trace: an acquire and its attempts, a
command, a process's wait, a stream, a file transfer, a release. The router wraps each in
``with spans(<record>):``, where the record is one of the typed dataclasses
below (`RouterSpan` is their closed union). A tracer is any callable taking a
record and returning a context manager, or None when it does not follow that
kind (stamina's hooks may return one the same way); ``router.tracing`` is
the OpenTelemetry one. The context manager is entered in the operation's own
context (the app's, carried to the router's loop, see ``router.engine``), so
a tracer's span is a child of the app's current one, and is exited with the
exception the operation raised, if any. The router fills a record's result
fields (``exit_code``...) before the exit. The events an operation emits
meanwhile are handed to the hooks in the same context, so a tracer that is
also a hook can put them on its open span.

A stream (`StreamSpan`: ``stream``, ``read_stream``) lasts as long as the app
iterates it, so its context manager is entered at the first pull and exited
when the iteration ends (exhausted, left early: ``GeneratorExit``, or failed),
maybe in another context (a generator closed by the collector): a tracer
must not make a stream's span current. `Spans.follow` gives it and the chunks
counted into the record.

A tracer that raises is logged and otherwise ignored, as a hook is. With no
tracer installed a span costs building its record, one call and an empty
``with`` (`Spans.__call__` returns one shared null context).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
from collections.abc import AsyncIterator, Coroutine, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from types import TracebackType
from typing import Any, ClassVar, Literal, Protocol, TypeVar

from providers.logs import Log
from providers.processes import OutputChunk

__all__ = [
    "AcquireSpan",
    "AttemptSpan",
    "CommandSpan",
    "ReleaseSpan",
    "RouterSpan",
    "Spans",
    "StreamSpan",
    "Tracer",
    "TransferSpan",
    "untraced",
]

T = TypeVar("T")

_log = Log("sandbox_router")

Phase = Literal["reserve", "create", "warm_claim", "hedge"]


@dataclass(slots=True)
class AcquireSpan:
    """An acquire, from its call to its lease or its error: a sticky ``session``'s, or
    the ``resume`` of a paused sandbox by its token. Its outcome comes as events
    (`Acquired`, `AcquireFailed`, `Failover`...)."""

    name: ClassVar[str] = "acquire"
    requires: tuple[str, ...] = ()
    session: bool = False
    resume: bool = False


@dataclass(slots=True)
class AttemptSpan:
    """One step of an acquire on ``entry``: ``reserve`` (the ledger's grant or denial),
    ``warm_claim`` (connecting to a warm sandbox), ``create`` (the provider's create,
    until it answers, also after the acquire stopped waiting), or ``hedge`` (the create
    of a spare entry started beside a slow one)."""

    name: ClassVar[str] = "attempt"
    phase: Phase
    entry: str
    attempt: int


@dataclass(slots=True)
class CommandSpan:
    """A command in a lease's sandbox: ``call`` is ``run``, ``run_code``, ``start`` (a
    background process's start) or ``wait`` (a background process's end, waited for:
    its ``command`` is not known there, ""). ``command`` is the command line, argv or
    code; a tracer records it only when the app asked it to."""

    name: ClassVar[str] = "command"
    call: str
    entry: str
    sandbox_id: str
    command: str | Sequence[str]
    exit_code: int | None = None  # a run's, once it returned
    timed_out: bool = False  # a run's, ended by its timeout
    process_id: str | None = None  # a started process's


@dataclass(slots=True)
class TransferSpan:
    """A file moved into or out of a lease's sandbox (``call``: ``read_file``,
    ``write_file``, ``upload_file``...); ``size`` in bytes where the call knows it."""

    name: ClassVar[str] = "transfer"
    call: str
    entry: str
    sandbox_id: str
    path: str
    size: int | None = None


@dataclass(slots=True)
class ReleaseSpan:
    """A lease's release: its sandbox killed (or kept for its session). Its slot is
    freed beside it, off the caller's path; `Released` says when, with its cost."""

    name: ClassVar[str] = "release"
    entry: str
    lease_id: str
    sandbox_id: str


@dataclass(slots=True)
class StreamSpan:
    """An iteration over a lease's sandbox's output: ``call`` is ``stream`` (a command's
    output chunks: ``source`` its command, ``size`` the characters) or ``read_stream``
    (a file's bytes: ``source`` its path, ``size`` the bytes). Held from the first
    pull to the iteration's end (see the module's docstring)."""

    name: ClassVar[str] = "stream"
    call: Literal["stream", "read_stream"]
    entry: str
    sandbox_id: str
    source: str | Sequence[str]
    chunks: int = 0
    size: int = 0


RouterSpan = AcquireSpan | AttemptSpan | CommandSpan | TransferSpan | ReleaseSpan | StreamSpan


class Tracer(Protocol):
    """Called as each operation starts (on the router's loop or the app's: keep it quick);
    the context manager it returns is entered then and exited when the operation ends."""

    def __call__(self, span: RouterSpan, /) -> AbstractContextManager[object] | None: ...


class Spans:
    """A router's tracers (``Router.tracers``: every part shares the one list)."""

    __slots__ = ("tracers",)

    def __init__(self) -> None:
        self.tracers: list[Tracer] = []

    def __call__(self, span: RouterSpan) -> AbstractContextManager[object]:
        """The context manager that wraps the operation ``span`` stands for."""
        if not self.tracers:
            return _UNTRACED
        return _Traced(self.tracers, span)

    def wrap(self, span: RouterSpan, work: Coroutine[Any, Any, T]) -> Coroutine[Any, Any, T]:
        """``work`` awaited inside ``span``, for work run as a task of its own (a create):
        ``work`` itself when no tracer is installed, so it costs no extra coroutine."""
        return self._around(span, work) if self.tracers else work

    async def _around(self, span: RouterSpan, work: Coroutine[Any, Any, T]) -> T:
        with self(span):
            return await work

    def follow(
        self, span: StreamSpan, items: AsyncIterator[T]
    ) -> tuple[AsyncIterator[T], AbstractContextManager[object]]:
        """``items`` counted into ``span`` as they pass, and the context manager to hold
        over their iteration (`router.portal.relay`, `router.portal.iterate`): ``items``
        themselves and a null context when no tracer is installed."""
        if not self.tracers:
            return items, _UNTRACED
        return _counted(span, items), _Traced(self.tracers, span)


async def _counted(span: StreamSpan, items: AsyncIterator[T]) -> AsyncIterator[T]:
    """``items``, each counted into ``span``; closing this closes them."""
    try:
        async for item in items:
            span.chunks += 1
            span.size += len(item.data if isinstance(item, OutputChunk) else item)  # type: ignore[arg-type]
            yield item
    finally:
        aclose = getattr(items, "aclose", None)
        if aclose is not None:
            await aclose()


_UNTRACED = contextlib.nullcontext()


def untraced(work: Coroutine[Any, Any, T]) -> asyncio.Task[T]:
    """A task for one of the router's own loops (heartbeats, refills, reaping), which
    outlives the call that happened to start it: run in an empty context, so its work
    joins no caller's trace (an app's HTTP instrumentation would hang every heartbeat
    under the span of the acquire that started the loop, for as long as it runs)."""
    return asyncio.create_task(work, context=contextvars.Context())


class _Traced:
    """Every tracer's context manager for one span, entered and exited in turn; a tracer
    that fails is logged and left out, and none can swallow the operation's error."""

    __slots__ = ("_entered", "_span", "_tracers")

    def __init__(self, tracers: Sequence[Tracer], span: RouterSpan) -> None:
        self._tracers = tuple(tracers)
        self._span = span
        self._entered: list[AbstractContextManager[object]] = []

    def __enter__(self) -> None:
        for tracer in self._tracers:
            try:
                scope = tracer(self._span)
                if scope is not None:
                    scope.__enter__()
                    self._entered.append(scope)
            except Exception:
                _failed(tracer, self._span)

    def __exit__(
        self,
        typ: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        while self._entered:
            scope = self._entered.pop()
            try:
                scope.__exit__(typ, exc, tb)
            except Exception:
                _failed(scope, self._span)


def _failed(tracer: object, span: RouterSpan) -> None:
    with contextlib.suppress(Exception):
        fields = {"tracer": repr(tracer), "span_name": span.name}
        _log.line(logging.ERROR, "sandbox_router.tracer_failed", fields, exc_info=True)
