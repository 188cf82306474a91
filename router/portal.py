"""Sync twins of async calls, derived rather than written twice.

The router's handles (sandbox, process, terminal) are written once, async,
and run their calls on the router's engine loop. Their sync twins are
`Portal` subclasses whose methods are `blocking` descriptors over the async
methods: like anyio's ``BlockingPortal.call``, calling one runs the async
method on the engine loop and waits. The `Router` has both APIs on one
object: each sync method is `sync_twin` of its ``a``-prefixed async one.
`relay` and `iterate` carry an async iterator that lives on the engine loop
to an async caller on another loop, or to a sync caller.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterator
from contextlib import AbstractContextManager
from typing import (
    TYPE_CHECKING,
    Any,
    Concatenate,
    Generic,
    ParamSpec,
    Protocol,
    TypeVar,
    overload,
)

from providers.errors import LeaseError
from providers.processes import deliver

if TYPE_CHECKING:
    from router.engine import Engine

__all__ = [
    "OnEngine",
    "Portal",
    "blocking",
    "iterate",
    "on_caller_loop",
    "relay",
    "sync_twin",
]

T = TypeVar("T")
R = TypeVar("R")
P = ParamSpec("P")
D = TypeVar("D", str, bytes)


A = TypeVar("A")

_NULL = contextlib.nullcontext()


class OnEngine:
    """An async handle whose calls run on the router's engine loop, refused once its
    lease is gone (``alive`` raises `LeaseError`)."""

    def __init__(self, engine: Engine, alive: Callable[[], None]) -> None:
        self._engine = engine
        self._alive = alive

    async def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        try:
            self._alive()
        except LeaseError:
            coro.close()
            raise
        return await self._engine.arun(coro)


class Portal(Generic[A]):
    """A sync handle over an async one (``_async``) whose calls run on ``_engine``."""

    _async: A

    def __init__(self, engine: Engine, alive: Callable[[], None]) -> None:
        self._engine = engine
        self._alive = alive

    def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        # Refused here, before the hop to the engine loop, when the lease is gone.
        try:
            self._alive()
        except LeaseError:
            coro.close()
            raise
        return self._engine.run(coro)


class blocking(Generic[P, R]):
    """The sync twin of one async handle method, as an attribute of a `Portal`.

    The twin keeps the async method's parameters (a ``ParamSpec``), so type
    checkers and ``help()`` show its real signature. It calls the method by
    name on the portal's async handle, so an override there is what runs.
    """

    def __init__(self, method: Callable[Concatenate[Any, P], Coroutine[Any, Any, R]]) -> None:
        self.name = method.__name__
        self.method = method
        params = list(inspect.signature(method).parameters.values())[1:]
        returns = inspect.signature(method).return_annotation
        self.signature = inspect.Signature(params, return_annotation=returns)

    @overload
    def __get__(self, handle: None, owner: type[Portal[Any]]) -> blocking[P, R]: ...

    @overload
    def __get__(self, handle: Portal[Any], owner: type[Portal[Any]]) -> Callable[P, R]: ...

    def __get__(
        self, handle: Portal[Any] | None, owner: type[Portal[Any]]
    ) -> blocking[P, R] | Callable[P, R]:
        if handle is None:
            return self
        bound: Callable[P, Coroutine[Any, Any, R]] = getattr(handle._async, self.name)

        @functools.wraps(self.method)
        def call(*args: P.args, **kwargs: P.kwargs) -> R:
            return handle._call(bound(*args, **kwargs))

        call.__signature__ = self.signature  # type: ignore[attr-defined]
        return call


class _Engined(Protocol):
    _engine: Engine


E = TypeVar("E", bound=_Engined)
S = TypeVar("S")


@overload
def sync_twin(
    method: Callable[Concatenate[E, P], Awaitable[R]],
) -> Callable[Concatenate[E, P], R]: ...


@overload
def sync_twin(
    method: Callable[Concatenate[E, P], Awaitable[R]], wrap: Callable[[R], S]
) -> Callable[Concatenate[E, P], S]: ...


def sync_twin(
    method: Callable[..., Awaitable[Any]], wrap: Callable[[Any], Any] | None = None
) -> Callable[..., Any]:
    """The sync twin of ``method``, an async method ``a<name>`` of an object whose calls
    run on its ``_engine`` (``acquire = sync_twin(aacquire, Lease.of)`` in `Router`).

    The twin is ``<name>``, with the method's parameters and docstring. Calling it
    calls the async method by name (so an override is what runs) on the engine loop
    and waits; ``wrap`` turns the async result into the sync one there (an
    `AsyncLease` into a `Lease`). On the engine loop itself it raises, as every
    sync call does: the async twin is the one to use there.
    """
    name = method.__name__
    signature = inspect.signature(method)
    if wrap is not None:
        signature = signature.replace(return_annotation=inspect.signature(wrap).return_annotation)

    @functools.wraps(method)
    def call(self: _Engined, /, *args: Any, **kwargs: Any) -> Any:
        async def awaited() -> Any:
            result = await getattr(self, name)(*args, **kwargs)
            return result if wrap is None else wrap(result)

        return self._engine.run(awaited())

    call.__name__ = name[1:]
    call.__qualname__ = method.__qualname__[: -len(name)] + name[1:]
    call.__signature__ = signature  # type: ignore[attr-defined]
    call.__annotations__ = {**method.__annotations__, "return": signature.return_annotation}
    return call


async def _step(items: AsyncIterator[T]) -> tuple[bool, T | None]:
    # A (more, item) pair: StopAsyncIteration does not cross a future well.
    try:
        return True, await items.__anext__()
    except StopAsyncIteration:
        return False, None


async def _close(items: AsyncIterator[T]) -> None:
    aclose = getattr(items, "aclose", None)
    if aclose is not None:
        await aclose()


async def relay(
    engine: Engine, items: AsyncIterator[T], span: AbstractContextManager[object] = _NULL
) -> AsyncIterator[T]:
    """``items`` (living on the engine loop), for an async caller on any loop; ``span``
    held from the first pull to the end (`router.spans.Spans.follow`)."""
    with span:
        try:
            while True:
                more, item = await engine.arun(_step(items))
                if not more:
                    return
                yield item  # type: ignore[misc]
        finally:
            await engine.arun(_close(items))


def iterate(
    engine: Engine, items: AsyncIterator[T], span: AbstractContextManager[object] = _NULL
) -> Iterator[T]:
    """``items`` (living on the engine loop), for a sync caller; ``span`` as `relay`'s."""
    with span:
        try:
            while True:
                more, item = engine.run(_step(items))
                if not more:
                    return
                yield item  # type: ignore[misc]
        finally:
            engine.run(_close(items))


def on_caller_loop(
    engine: Engine, callback: Callable[[D], Awaitable[None] | None] | None
) -> Callable[[D], Awaitable[None] | None] | None:
    """``callback`` run on the calling loop when the engine runs elsewhere.

    An async app's callback may touch its own loop's objects, so it must not
    run on the router's thread; each call is awaited, so order is kept.
    """
    if callback is None or engine.in_engine_thread():
        return callback
    caller = asyncio.get_running_loop()

    def hop(data: D) -> Awaitable[None]:
        future = asyncio.run_coroutine_threadsafe(deliver(callback, data), caller)
        return asyncio.wrap_future(future)

    return hop
