"""The Redis store's Lua scripts, and the two runners that send them.

A `Script` is one ``lua/<name>.lua`` file (behind ``lib.lua`` when it uses
the shared rules) and its SHA1. A `ScriptRunner` runs a script by its SHA,
loads it on NOSCRIPT, and raises redis-py's exceptions either way; `post`
starts the call at once and hands its answer to a callback (a commit or a
release that nobody waits for then needs no task). Two implement it:

- `router.state.resp.ScriptConnection`: one pipelined socket per event loop,
  the hot path on ``redis://``, ``rediss://`` and ``unix://`` URLs with the
  options it knows;
- `RedisPyRunner`: the store's redis-py client, for every URL (Sentinel and
  Cluster find the master or the slot's node themselves).

`runner` is the one place that chooses between them.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any, Literal, Protocol, TypeVar

from redis import exceptions as redis_errors

from providers.errors import ConfigError
from router.state import resp
from router.state.posted import Posted

__all__ = [
    "RUNNERS",
    "RedisPyRunner",
    "RunnerName",
    "Script",
    "ScriptRunner",
    "runner",
    "script",
]

T = TypeVar("T")
RunnerName = Literal["auto", "resp", "redis-py"]
RUNNERS: tuple[RunnerName, ...] = ("auto", "resp", "redis-py")
_WITH_LIB = frozenset(
    {"reserve", "settle", "release", "heartbeat", "record", "reconcile", "snapshot",
     "session_release", "paused_hold", "paused_settle"}
)  # fmt: skip
_WITH_WARM = frozenset({"reserve", "warm_put", "warm_take", "warm_kept"})
_WITH_SESSION = frozenset({"session_claim", "session_bind", "session_release"})


@dataclass(frozen=True, slots=True)
class Script:
    name: str
    text: str
    sha: str


@functools.cache
def script(name: str) -> Script:
    """The script ``lua/<name>.lua``, ``lib.lua`` (and ``warm.lua``, ``session.lua``) in
    front when it needs the shared rules."""
    lua = resources.files("router.state") / "lua"
    text = (lua / f"{name}.lua").read_text()
    if name in _WITH_SESSION:
        text = (lua / "session.lua").read_text() + "\n" + text
    if name in _WITH_WARM:
        text = (lua / "warm.lua").read_text() + "\n" + text
    if name in _WITH_LIB or name in _WITH_WARM:
        text = (lua / "lib.lua").read_text() + "\n" + text
    return Script(name, text, hashlib.sha1(text.encode()).hexdigest())


class ScriptRunner(Protocol):
    async def evalsha(self, sha: str, script: str, keys: Sequence[str], args: Sequence[Any]) -> Any:
        """Run the script by ``sha``, sending ``script`` itself on NOSCRIPT."""

    def post(
        self,
        sha: str,
        script: str,
        keys: Sequence[str],
        args: Sequence[Any],
        answer: Callable[[asyncio.Future[Any]], T],
    ) -> Posted[T]:
        """`evalsha` started now: ``answer`` of the finished call (its reply, or the
        error it raised), as a future that needs no waiting caller."""

    async def aclose(self) -> None: ...


class RedisPyRunner:
    """Scripts through a redis-py client (plain, Sentinel's master, or Cluster)."""

    def __init__(self, client: Any) -> None:
        self._client = client

    async def evalsha(self, sha: str, script: str, keys: Sequence[str], args: Sequence[Any]) -> Any:
        try:
            return await self._client.evalsha(sha, len(keys), *keys, *args)
        except redis_errors.NoScriptError:
            return await self._client.eval(script, len(keys), *keys, *args)

    def post(
        self,
        sha: str,
        script: str,
        keys: Sequence[str],
        args: Sequence[Any],
        answer: Callable[[asyncio.Future[Any]], T],
    ) -> Posted[T]:
        out: Posted[T] = Posted(answer, loop=asyncio.get_running_loop())
        asyncio.ensure_future(self.evalsha(sha, script, keys, args)).add_done_callback(out.land)
        return out

    async def aclose(self) -> None:
        """Nothing of its own: the store closes the client."""


def runner(url: str, client: Any, kind: RunnerName = "auto") -> ScriptRunner:
    """The runner for ``url``: the lean connection where it serves, else redis-py.

    ``kind`` forces one (the contract suite runs every store test over both).
    """
    if kind == "redis-py" or (kind == "auto" and not resp.supports(url)):
        return RedisPyRunner(client)
    if kind not in RUNNERS:
        raise ConfigError(f"script runner: expected one of {', '.join(RUNNERS)}, got {kind!r}")
    if not resp.supports(url):
        raise ConfigError("script runner 'resp' serves redis://, rediss:// and unix:// only")
    return resp.ScriptConnection(url)
