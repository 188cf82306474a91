"""Sticky sessions' bindings in Redis: a mixin of `router.state.redis.RedisStore`.

A session's binding (which sandbox, paused or not, who holds it) is one hash
field beside a sorted set of expiries (`router.state.redis_keys`), changed by
the ``session_*`` scripts (claim, bind, release, prune) or one transaction.
"""

from __future__ import annotations

import abc
import json
from collections.abc import Callable, Sequence
from typing import Any

from router.state.base import CALL_MEMORY, SessionBinding, SessionClaim
from router.state.redis_keys import KeySpace

__all__ = ["RedisSessions"]

_CALL_MS = int(CALL_MEMORY * 1000)


class RedisSessions(abc.ABC):
    """`router.state.base.SessionSupport` over the store's scripts and pipelines."""

    _keys: KeySpace

    @abc.abstractmethod
    async def _script(self, name: str, keys: Sequence[str], args: Sequence[Any]) -> Any:
        """Run the Lua script ``name``; its raw reply."""

    @abc.abstractmethod
    async def _commands(
        self, queue: Callable[[Any], object], *, transaction: bool = False
    ) -> list[Any]:
        """Run the commands ``queue`` adds to a pipeline; their replies."""

    async def claim_session(
        self, session: str, holder: str, expires: float, now: float
    ) -> SessionClaim:
        reply = await self._script(
            "session_claim", self._keys.sessions(), [session, holder, expires, now]
        )
        if reply[0] == b"new":
            return SessionClaim(False)
        data = json.loads(reply[1])
        return SessionClaim(reply[0] == b"busy", _binding(data, float(data["expires"])))

    async def bind_session(
        self,
        session: str,
        entry: str,
        sandbox_id: str,
        expires: float,
        now: float,
        *,
        paused: bool = False,
        kept: bool = False,
        holder: str = "",
    ) -> bool:
        args = [session, entry, sandbox_id, expires, now, _flag(paused), holder, _flag(kept)]
        return bool(await self._script("session_bind", self._keys.sessions(), args))

    async def release_session(
        self,
        session: str,
        holder: str,
        expires: float,
        now: float,
        *,
        sandbox_id: str = "",
        paused: bool | None = None,
        drop: bool = False,
    ) -> bool:
        marked = "" if paused is None else _flag(paused)
        args = [session, holder, sandbox_id, expires, now, marked, _flag(drop), _CALL_MS]
        keys = [*self._keys.sessions(), self._keys.session_memo()]
        answer: bytes = await self._script("session_release", keys, args)
        return answer == b"1"

    async def session(self, session: str, now: float) -> SessionBinding | None:
        index, bindings = self._keys.sessions()
        raw, expires = await self._commands(
            lambda pipe: pipe.hget(bindings, session).zscore(index, session), transaction=True
        )
        return _live_binding(raw, expires, now)

    async def take_session(self, session: str, now: float) -> SessionBinding | None:
        index, bindings = self._keys.sessions()
        raw, expires, *_ = await self._commands(
            lambda pipe: (
                pipe.hget(bindings, session).zscore(index, session)
                .hdel(bindings, session).zrem(index, session)
            ),
            transaction=True,
        )  # fmt: skip
        return _live_binding(raw, expires, now)

    async def unbind_session(self, session: str) -> None:
        index, bindings = self._keys.sessions()
        await self._commands(
            lambda pipe: pipe.hdel(bindings, session).zrem(index, session), transaction=True
        )

    async def bound_sandboxes(self, now: float) -> set[tuple[str, str]]:
        index, bindings = self._keys.sessions()
        await self._script("session_prune", [index, bindings], [now])
        [values] = await self._commands(lambda pipe: pipe.hvals(bindings))
        found = set()
        for raw in values:
            data = json.loads(raw)
            if data["sandbox_id"]:  # a claim for a create names none yet
                found.add((data["entry"], data["sandbox_id"]))
        return found


def _flag(value: bool) -> str:
    return "1" if value else "0"


def _binding(data: dict[str, Any], expires: float) -> SessionBinding:
    return SessionBinding(
        data["entry"],
        data["sandbox_id"],
        expires,
        bool(data.get("paused", False)),
        data.get("holder", ""),
    )


def _live_binding(raw: bytes | None, expires: float | None, now: float) -> SessionBinding | None:
    """A binding read back: None when it is gone, expired, or a claim naming no sandbox."""
    if raw is None or expires is None or expires <= now:
        return None
    found = _binding(json.loads(raw), float(expires))
    return found if found.sandbox_id else None
