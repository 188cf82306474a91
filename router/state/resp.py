"""A lean Redis connection for the store's hot path: script calls, pipelined.

redis-py checks a connection out of its pool for every command, packs the
command in Python and parses the reply through several layers: about
0.1-0.15 ms of interpreter time per call, and an acquire plus a release make
three script calls. Concurrent calls each hold a pooled connection, so they
never share a write.

`ScriptConnection` keeps one socket per event loop, packs each command with
``hiredis.pack_command``, sends the commands made in one loop iteration in
at most two writes (`_Protocol`), and hands replies to callers in order
(Redis answers in order, and ``hiredis.Reader`` parses them in C). So
concurrent acquires pipeline on one socket, and a call costs a share of one
write and one parse.

It runs only EVALSHA of the store's scripts, which are idempotent: on a
dropped connection or a timeout the call is retried on a new connection
(twice, with a short backoff), as redis-py's reconnect policy would.
`ScriptConnection.post` sends a call without a caller waiting on it: its
reply settles a `router.state.posted.Posted` future in a callback.

It serves ``redis://``, ``rediss://`` and ``unix://``; Sentinel and Cluster
keep redis-py, which knows how to find the master or the slot's node.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import ssl
from collections.abc import Callable, Sequence
from typing import Any, TypeVar, cast
from urllib.parse import parse_qs, urlsplit

import hiredis
from redis import exceptions as redis_errors
from redis.asyncio.connection import parse_url

from router.state.posted import Posted

__all__ = ["ScriptConnection", "supports"]

T = TypeVar("T")
_RETRIES = 2
_TRANSPORT = (redis_errors.ConnectionError, redis_errors.TimeoutError, OSError)
_BACKOFF = (0.02, 0.04)
_SCHEMES = ("redis", "rediss", "unix")
_SSL_REQS = {"none": ssl.CERT_NONE, "optional": ssl.CERT_OPTIONAL, "required": ssl.CERT_REQUIRED}
_TLS_OPTIONS = frozenset(
    {"ssl_ca_certs", "ssl_cert_reqs", "ssl_certfile", "ssl_keyfile", "ssl_check_hostname"}
)
_OPTIONS = _TLS_OPTIONS | {"socket_timeout", "socket_connect_timeout", "max_connections", "db"}


def supports(url: str) -> bool:
    """True when this connection can serve ``url`` (else the store uses redis-py alone)."""
    parts = urlsplit(url)
    return parts.scheme in _SCHEMES and set(parse_qs(parts.query)) <= _OPTIONS


class _Protocol(asyncio.Protocol):
    """One socket: commands out as they come, replies back to their callers in order.

    The first command of a loop iteration leaves at once (a lone call, the
    common case, waits for no loop turn); the ones made after it in the same
    iteration leave together in one write when the iteration ends. One timer
    watches the oldest unanswered command (Redis answers in order, so when it
    is late every later one is too); past its deadline the socket is closed
    and every caller still waiting gets a TimeoutError.
    """

    def __init__(self, timeout: float) -> None:
        self._timeout = timeout
        self._parser = hiredis.Reader()
        self._waiting: collections.deque[tuple[asyncio.Future[Any], float]] = collections.deque()
        self._batch: list[bytes] | None = None  # None: nothing written this loop iteration
        self._timer: asyncio.TimerHandle | None = None
        self._timed_out = False
        self._loop = asyncio.get_running_loop()
        self._transport: asyncio.Transport | None = None
        self.lost: str | None = None  # why the socket is unusable

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass

    def data_received(self, data: bytes) -> None:
        self._parser.feed(data)
        while True:
            try:
                reply = self._parser.gets()
            except hiredis.ProtocolError as exc:
                self.close(f"unreadable reply from Redis: {exc}")
                return
            if reply is False:
                return
            if not self._waiting:
                self.close("Redis sent a reply nobody asked for")
                return
            waiter, _ = self._waiting.popleft()
            if not waiter.done():  # a caller that was cancelled left
                waiter.set_result(reply)

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = self.lost or f"connection to Redis lost: {exc or 'closed by the server'}"
        error = redis_errors.TimeoutError if self._timed_out else redis_errors.ConnectionError
        if self._timer is not None:
            self._timer.cancel()
        while self._waiting:
            waiter, _ = self._waiting.popleft()
            if not waiter.done():
                waiter.set_exception(error(self.lost))

    def send(self, *args: Any) -> asyncio.Future[Any]:
        if self.lost is not None:
            raise redis_errors.ConnectionError(self.lost)
        waiter = self._loop.create_future()
        self._waiting.append((waiter, self._loop.time() + self._timeout))
        command = hiredis.pack_command(args)
        if self._batch is None:
            self._batch = []
            self._loop.call_soon(self._flush)
            self._write(command)
        else:
            self._batch.append(command)
        if self._timer is None:
            self._watch()
        return waiter

    def _flush(self) -> None:
        batch, self._batch = self._batch, None
        if batch:
            self._write(b"".join(batch))

    def _write(self, data: bytes) -> None:
        if self.lost is None and self._transport is not None:
            self._transport.write(data)

    def _watch(self) -> None:
        self._timer = self._loop.call_at(self._waiting[0][1], self._check)

    def _check(self) -> None:
        self._timer = None
        if not self._waiting:
            return
        if self._waiting[0][1] <= self._loop.time():
            self._timed_out = True
            self.close(f"Redis did not answer within {self._timeout}s")
        else:
            self._watch()

    def close(self, why: str) -> None:
        self.lost = self.lost or why
        if self._transport is not None:
            self._transport.close()


class ScriptConnection:
    """EVALSHA over one pipelined socket per event loop (see the module docstring)."""

    def __init__(self, url: str) -> None:
        self._kwargs: dict[str, Any] = dict(parse_url(url))
        self._timeout = float(self._kwargs.get("socket_timeout") or 2.0)
        self._connect_timeout = float(self._kwargs.get("socket_connect_timeout") or 2.0)
        self._tls = urlsplit(url).scheme == "rediss"
        self._conn: _Protocol | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._connecting: asyncio.Task[_Protocol] | None = None

    async def evalsha(self, sha: str, script: str, keys: Sequence[str], args: Sequence[Any]) -> Any:
        """Run a cached script (loading it on NOSCRIPT); transport errors raise redis-py's."""
        for attempt in range(_RETRIES + 1):
            try:
                reply = await self._once(sha, script, keys, args)
            except _TRANSPORT:
                if attempt == _RETRIES:
                    raise
                await asyncio.sleep(_BACKOFF[min(attempt, len(_BACKOFF) - 1)])
                continue
            if isinstance(reply, hiredis.ReplyError):
                raise _reply_error(reply)
            return reply
        raise AssertionError("unreachable")  # pragma: no cover

    def post(
        self,
        sha: str,
        script: str,
        keys: Sequence[str],
        args: Sequence[Any],
        answer: Callable[[asyncio.Future[Any]], T],
    ) -> Posted[T]:
        """`evalsha`, sent before this returns: ``answer`` of the finished call, as a future.

        On this loop's live socket the command is written at once and no task
        runs: a callback hands the reply to ``answer`` (on NOSCRIPT it sends
        the script itself first, as `evalsha` does). The cases that need
        `evalsha`'s retries (no socket yet, a dropped one, a timeout) go on as
        a task running it.
        """
        loop = asyncio.get_running_loop()
        out: Posted[T] = Posted(answer, loop=loop)
        conn = self._conn
        if conn is None or conn.lost is not None or self._loop is not loop:
            self._retry_into(out, sha, script, keys, args)
            return out

        def landed(first: bool, call: asyncio.Future[Any]) -> None:
            if out.done() and not out.cancelled():
                return
            if call.cancelled() or isinstance(call.exception(), _TRANSPORT):
                if out.cancelled():  # its caller is gone: no retry, the error is the answer
                    out.land(call)
                else:
                    self._retry_into(out, sha, script, keys, args)
                return
            reply = call.result()
            if isinstance(reply, hiredis.ReplyError):
                if first and str(reply).startswith("NOSCRIPT") and not out.cancelled():
                    if conn.lost is not None:
                        self._retry_into(out, sha, script, keys, args)
                        return
                    loading = conn.send("EVAL", script, len(keys), *keys, *args)
                    loading.add_done_callback(functools.partial(landed, False))
                    return
                call = loop.create_future()
                call.set_exception(_reply_error(reply))
            out.land(call)

        conn.send("EVALSHA", sha, len(keys), *keys, *args).add_done_callback(
            functools.partial(landed, True)
        )
        return out

    def _retry_into(
        self, out: Posted[T], sha: str, script: str, keys: Sequence[str], args: Sequence[Any]
    ) -> None:
        asyncio.ensure_future(self.evalsha(sha, script, keys, args)).add_done_callback(out.land)

    async def _once(self, sha: str, script: str, keys: Sequence[str], args: Sequence[Any]) -> Any:
        conn = self._conn
        if conn is None or conn.lost is not None or self._loop is not asyncio.get_running_loop():
            conn = await self._connection()
        reply = await conn.send("EVALSHA", sha, len(keys), *keys, *args)
        if isinstance(reply, hiredis.ReplyError) and str(reply).startswith("NOSCRIPT"):
            reply = await conn.send("EVAL", script, len(keys), *keys, *args)
        return reply

    async def _connection(self) -> _Protocol:
        """A new socket for this loop (one connect, however many callers wait for it)."""
        loop = asyncio.get_running_loop()
        if self._connecting is None or self._loop is not loop or self._connecting.done():
            self._loop = loop
            self._connecting = loop.create_task(self._connect())
        return await asyncio.shield(self._connecting)

    async def _connect(self) -> _Protocol:
        kw = self._kwargs
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self._connect_timeout):
                protocol = functools.partial(_Protocol, self._timeout)
                if "path" in kw:
                    _, conn = await loop.create_unix_connection(protocol, kw["path"])
                else:
                    host = kw.get("host", "localhost")
                    _, conn = await loop.create_connection(
                        protocol,
                        host,
                        kw.get("port", 6379),
                        ssl=self._ssl_context() if self._tls else None,
                        server_hostname=host if self._tls else None,
                    )
                await self._handshake(conn)
        except TimeoutError:
            raise redis_errors.TimeoutError(
                f"could not connect to Redis within {self._connect_timeout}s"
            ) from None
        except OSError as exc:
            raise redis_errors.ConnectionError(f"could not connect to Redis: {exc}") from exc
        self._conn = conn
        return conn

    async def _handshake(self, conn: _Protocol) -> None:
        kw = self._kwargs
        steps: list[tuple[Any, ...]] = []
        if kw.get("password") is not None:
            user = kw.get("username")
            steps.append(("AUTH", user, kw["password"]) if user else ("AUTH", kw["password"]))
        if kw.get("db"):
            steps.append(("SELECT", kw["db"]))
        for reply in await asyncio.gather(*(conn.send(*step) for step in steps)):
            if isinstance(reply, hiredis.ReplyError):
                conn.close("the handshake failed")
                raise _reply_error(reply)

    def _ssl_context(self) -> ssl.SSLContext:
        kw = self._kwargs
        context = ssl.create_default_context(cafile=kw.get("ssl_ca_certs"))
        reqs = kw.get("ssl_cert_reqs", "required")
        # The certificate must name the host we dialled, as redis-py checks by default.
        context.check_hostname = _flag(kw.get("ssl_check_hostname", True)) and reqs != "none"
        context.verify_mode = _SSL_REQS[str(reqs).lower()]
        if kw.get("ssl_certfile"):
            context.load_cert_chain(kw["ssl_certfile"], kw.get("ssl_keyfile"))
        return context

    async def aclose(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None and self._loop is asyncio.get_running_loop():
            conn.close("the store was closed")


def _flag(value: Any) -> bool:
    return str(value).lower() in ("1", "true", "yes", "on")


def _reply_error(reply: hiredis.ReplyError) -> redis_errors.RedisError:
    """The redis-py exception for an error reply, so callers see one error vocabulary."""
    text = str(reply)
    if text.startswith("LOADING"):
        return redis_errors.BusyLoadingError(text)
    if text.startswith(("NOAUTH", "WRONGPASS")):
        return redis_errors.AuthenticationError(text)
    if text.startswith("READONLY"):
        return redis_errors.ReadOnlyError(text)
    return redis_errors.ResponseError(text)
