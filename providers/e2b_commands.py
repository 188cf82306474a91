"""E2B's envd ``process.Process/Start``, the stream under `E2BSandbox.run`, read over the
aiohttp pool the provider keeps per event loop.

The async SDK's ``commands.run`` speaks Connect through ``connectrpc`` on its pyqwest
transport: each answer reaches the loop from tokio's threads, and each event passes
protobuf's JSON parser, interceptors and a task of the command handle. On E2B's emulator
a ``run("true")`` cost this process about twice the CPU of the sync SDK's (the deepagents
row of benchmarks/RESULTS.md). The adapter sends the SDK's request itself (its URL, the
sandbox headers and envd user the SDK sends, the Connect envelope of its JSON codec) and
keeps the SDK's meaning of the answer: an error status or an end-of-stream error becomes
the ``ConnectError`` the SDK's transport would raise, mapped by the SDK's own
``handle_rpc_exception``; output is decoded as the SDK's handle decodes it (incremental
UTF-8, replacing what is not); a stream cut with the sandbox gone is the SDK's
``SandboxNotRunningException``. A command read to its end gives its connection back
to the pool (one cut short drops it). Killing a command on its deadline stays the SDK's
call (``commands.kill``). Streaming runs and processes stay on the SDK.
"""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import json
import struct
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from providers.e2b_execute import cuts, running, send

if TYPE_CHECKING:
    import aiohttp
    from e2b import AsyncSandbox

__all__ = ["Command", "start"]

_END_STREAM = 0b10
_HEADER = struct.Struct(">BI")
_TRAILER_SECONDS = 1.0


@dataclass(eq=False)
class Command:
    """A started command: its pid, the output read so far, and how it ended."""

    pid: int
    _response: aiohttp.ClientResponse
    _native: AsyncSandbox
    _read_out: bool = False
    _out: list[str] = field(default_factory=list)
    _err: list[str] = field(default_factory=list)
    _decoders: tuple[Any, Any] = field(
        default_factory=lambda: (
            codecs.getincrementaldecoder("utf-8")(errors="replace"),
            codecs.getincrementaldecoder("utf-8")(errors="replace"),
        )
    )

    @property
    def stdout(self) -> str:
        return "".join(self._out)

    @property
    def stderr(self) -> str:
        return "".join(self._err)

    async def wait(self) -> tuple[int, str | None]:
        """Read to the end event: the exit code and envd's error (``signal: killed``)."""
        try:
            while True:
                message = await _next(self._response)
                if message is None:
                    break
                event = message.get("event") or {}
                if "data" in event:
                    self._take(event["data"])
                elif "end" in event:
                    self._flush()
                    end = event["end"]
                    await self._finish()
                    return int(end.get("exitCode", 0)), end.get("error")
        except cuts() as cut:
            self._flush()
            await _gone_or(cut, self._native)
            raise
        self._flush()
        await _gone_or(None, self._native)
        raise ConnectionResetError("the command's stream ended without its end event")

    def close(self) -> None:
        """Give the connection back to the pool once the stream was read to its end; else
        drop it (envd sees the client go)."""
        if self._read_out:
            self._response.release()
        else:
            self._response.close()

    async def _finish(self) -> None:
        """Read the end-of-stream envelope that follows the end event, so the connection
        can serve the next command; given up after a moment (then it is dropped)."""
        with contextlib.suppress(Exception):
            async with asyncio.timeout(_TRAILER_SECONDS):
                self._read_out = await _next(self._response) is None

    def _take(self, data: dict[str, Any]) -> None:
        import base64

        for name, into, decoder in (
            ("stdout", self._out, self._decoders[0]),
            ("stderr", self._err, self._decoders[1]),
        ):
            chunk = data.get(name)
            if chunk is not None:
                text = decoder.decode(base64.b64decode(chunk))
                if text:
                    into.append(text)

    def _flush(self) -> None:
        for into, decoder in zip((self._out, self._err), self._decoders, strict=True):
            text = decoder.decode(b"", final=True)
            if text:
                into.append(text)


async def start(
    session: aiohttp.ClientSession,
    native: AsyncSandbox,
    command: str,
    envs: dict[str, str] | None,
    cwd: str | None,
    request_timeout: float | None,
) -> Command:
    """Start ``command`` as the SDK's ``commands.run`` does (``bash -l -c``, no stdin, no
    deadline of envd's own) and wait, at most ``request_timeout`` (None: no limit), for its
    start event."""
    from e2b.connection_config import KEEPALIVE_PING_HEADER, KEEPALIVE_PING_INTERVAL_SEC
    from e2b.envd.utils import authentication_header

    process: dict[str, Any] = {"cmd": "/bin/bash", "args": ["-l", "-c", command]}
    if envs:
        process["envs"] = envs
    if cwd:
        process["cwd"] = cwd
    body = json.dumps({"process": process}, separators=(",", ":")).encode()
    headers = {
        **native.connection_config.sandbox_headers,
        **authentication_header(native._envd_version, None),
        KEEPALIVE_PING_HEADER: str(KEEPALIVE_PING_INTERVAL_SEC),
        "Content-Type": "application/connect+json",
        "Connect-Protocol-Version": "1",
    }
    url = f"{native.envd_api_url}/process.Process/Start"
    payload = _HEADER.pack(0, len(body)) + body
    try:
        async with asyncio.timeout(request_timeout):
            response = await send(session, url, payload, headers)
            try:
                return Command(await _started(response), response, native)
            except BaseException:
                response.close()
                raise
    except cuts() as cut:
        await _gone_or(cut, native)
        raise


async def _started(response: aiohttp.ClientResponse) -> int:
    """The pid of the start event the stream opens with."""
    if response.status >= 400:
        raise _status_error(response.status, response.content_type, await response.read())
    message = await _next(response)
    pid = ((message or {}).get("event") or {}).get("start", {}).get("pid")
    if pid is None:
        raise _protocol_error("the command's stream did not start with its pid")
    return int(pid)


async def _next(response: aiohttp.ClientResponse) -> dict[str, Any] | None:
    """The next message of the stream; None at its end (an end-of-stream error raises)."""
    from e2b.envd.rpc import handle_rpc_exception

    try:
        flags, length = _HEADER.unpack(await response.content.readexactly(_HEADER.size))
    except asyncio.IncompleteReadError as eof:
        if eof.partial:
            raise
        return None
    message: dict[str, Any] = json.loads(await response.content.readexactly(length) or b"{}")
    if flags & _END_STREAM:
        error = message.get("error")
        if error:
            raise handle_rpc_exception(_connect_error(error.get("code"), error.get("message")))
        return None
    return message


def _status_error(status: int, content_type: str, body: bytes) -> Exception:
    """What the SDK raises for an error status (`e2b.envd.client_shared.plain_http_error`,
    or the Connect error the body names)."""
    from e2b.envd.client_shared import plain_http_error
    from e2b.envd.rpc import handle_rpc_exception

    plain: Exception | None = plain_http_error(status, content_type, body)
    if plain is None:
        named = json.loads(body)
        plain = _connect_error(named.get("code"), named.get("message"))
    return handle_rpc_exception(plain)  # type: ignore[no-any-return]


def _connect_error(code: object, message: object) -> Exception:
    from connectrpc.code import Code
    from connectrpc.errors import ConnectError

    try:
        known = Code(code)
    except ValueError:
        known = Code.UNKNOWN
    return ConnectError(known, str(message or ""))


def _protocol_error(message: str) -> Exception:
    from connectrpc.code import Code
    from connectrpc.errors import ConnectError

    return ConnectError(Code.INTERNAL, message)


async def _gone_or(cut: BaseException | None, native: AsyncSandbox) -> None:
    """Raise the SDK's ``SandboxNotRunningException`` when a cut stream's sandbox is gone."""
    from e2b.exceptions import SandboxNotRunningException

    if not await running(native):
        raise SandboxNotRunningException(
            "the sandbox was killed or reached its end of life while the command ran"
        ) from cut
