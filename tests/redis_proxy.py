"""A TCP proxy in front of the test Redis that misbehaves as a network can.

It loses the next reply (`lose_next_reply`: the script ran, its answer never
came) or holds every reply back (`stop_replies` / `let_replies_through`: a
caller can be cancelled while the server answers), and can drop every connection
with what it holds (`cut`: the server went down before its answers left). `requests` counts the
chunks callers sent, so a test knows a call is on the wire.
"""

from __future__ import annotations

import asyncio
import contextlib

__all__ = ["RedisProxy"]


class RedisProxy:
    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.lose_next_reply = False
        self.lost = 0
        self.requests = 0
        self.port = 0
        self._open = asyncio.Event()
        self._open.set()
        self._pipes: set[asyncio.Task[None]] = set()
        self._clients: set[asyncio.StreamWriter] = set()

    async def __aenter__(self) -> RedisProxy:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._server.close()
        for pipe in self._pipes:
            pipe.cancel()

    def stop_replies(self) -> None:
        self._open.clear()

    def let_replies_through(self) -> None:
        self._open.set()

    def cut(self) -> None:
        """Close every connection now, dropping the replies held back."""
        for pipe in self._pipes:
            pipe.cancel()
        for client in self._clients:
            client.transport.abort()
        self._open.set()

    async def _serve(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        self._clients.add(client_w)
        try:
            server_r, server_w = await asyncio.open_connection(*self.target)
        except OSError:
            client_w.transport.abort()  # the server is down: the caller sees it refused
            return
        for pipe in (self._pump(client_r, server_w, False), self._pump(server_r, client_w, True)):
            task = asyncio.ensure_future(pipe)
            self._pipes.add(task)
            task.add_done_callback(self._pipes.discard)

    async def _pump(
        self, src: asyncio.StreamReader, dst: asyncio.StreamWriter, replies: bool
    ) -> None:
        with contextlib.suppress(OSError):
            while data := await src.read(65536):
                if replies:
                    await self._open.wait()
                    if self.lose_next_reply:
                        self.lose_next_reply = False
                        self.lost += 1
                        continue
                else:
                    self.requests += 1
                dst.write(data)
                await dst.drain()
        dst.close()
