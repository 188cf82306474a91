"""The event loop every provider and store call runs on.

The routing logic is written once, async. Each Router owns one loop on a
background thread; the sync API submits coroutines to it and waits, the
async API submits and awaits the future. So both APIs share one
implementation, and SDK clients and Redis connections (which belong to the
loop that made them) always live on the same loop.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import os
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

from providers.errors import RouterClosed

__all__ = ["Engine"]

T = TypeVar("T")

_PATIENCE = 10.0  # seconds a closing loop waits for its tasks, then for its thread


class Engine:
    """A private event loop on a daemon thread, started on first use."""

    def __init__(self, name: str = "sandbox-router") -> None:
        self._name = name
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._adopted = False
        self._pid = os.getpid()
        self.closed = False

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self.closed:
                raise RouterClosed("the router is closed; make a new Router")
            if self._pid != os.getpid():  # forked: the thread did not come along
                self._loop, self._thread, self._pid = None, None, os.getpid()
                self._adopted = False
            if self._loop is None:
                loop = asyncio.new_event_loop()
                ready = threading.Event()

                def run() -> None:
                    asyncio.set_event_loop(loop)
                    loop.call_soon(ready.set)
                    loop.run_forever()

                self._thread = threading.Thread(target=run, name=self._name, daemon=True)
                self._thread.start()
                ready.wait()
                self._loop = loop
            return self._loop

    def adopt(self, loop: asyncio.AbstractEventLoop) -> bool:
        """Run on ``loop`` rather than a thread of our own, if nothing ran yet.

        False when the engine already runs elsewhere (its clients belong to
        that loop, so it stays there).
        """
        with self._lock:
            if self._loop is None or self._pid != os.getpid():
                self._loop, self._thread, self._adopted = loop, None, True
                self._pid = os.getpid()
            return self._loop is loop

    def _on_engine_loop(self) -> bool:
        try:
            return asyncio.get_running_loop() is self._loop
        except RuntimeError:
            return False

    def in_engine_thread(self) -> bool:
        if self._adopted:
            return self._on_engine_loop()
        return self._thread is not None and threading.current_thread() is self._thread

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        try:
            loop = self.loop
        except RouterClosed:
            coro.close()
            raise
        return asyncio.run_coroutine_threadsafe(coro, loop)

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run on the engine loop and wait (the sync API)."""
        if self.in_engine_thread():
            coro.close()
            raise RuntimeError(
                "sandbox-router: a sync Router method was called from inside the router's own "
                "event loop (e.g. a hook); use the async API there"
            )
        future = self.submit(coro)
        try:
            return future.result()
        except BaseException:
            future.cancel()
            raise

    async def arun(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run on the engine loop and await it (the async API); cancellation propagates."""
        if self.closed:
            coro.close()
            raise RouterClosed("the router is closed; make a new Router")
        if self._loop is not None and self._on_engine_loop():
            return await coro
        return await asyncio.wrap_future(self.submit(coro))

    def close(self) -> None:
        """Stop our own loop; an adopted one is the app's and keeps running."""
        with self._lock:
            loop, thread = self._loop, self._thread
            self._loop = self._thread = None
            self._adopted = False
            self.closed = True
        if loop is not None and thread is not None and thread is not threading.current_thread():
            ended = asyncio.run_coroutine_threadsafe(_end_the_rest(), loop)
            with contextlib.suppress(concurrent.futures.TimeoutError):
                ended.result(_PATIENCE)
            loop.call_soon_threadsafe(loop.stop)
            thread.join(_PATIENCE)
            loop.close()


async def _end_the_rest() -> None:
    """Cancel what still runs on the loop and wait for it, as ``asyncio.run`` does at its end:
    a task left pending (a held lease's process follower, a kernel's reader) would otherwise
    be destroyed by the collector, its files still open."""
    current = asyncio.current_task()
    rest = [task for task in asyncio.all_tasks() if task is not current]
    for task in rest:
        task.cancel()
    if rest:
        await asyncio.wait(rest, timeout=_PATIENCE / 2)
    await asyncio.get_running_loop().shutdown_asyncgens()
