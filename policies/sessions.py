"""Sticky sessions, one holder at a time: the rules of a session's binding.

A binding names the sandbox a session keeps (its entry and id), until when
(``expires``), whether that sandbox is paused, and its ``holder``: the
acquire, then the lease, using it now ("" when none). An acquire of a
session first claims it (`claim`): it gets the session only when no live
binding has another holder, so two acquires of one session, on any
replicas, never both hold it: the second waits for the first's release.
While a lease holds it, only that holder may keep (`bind` with ``kept``) or
let go of (`let_go`) the binding, so only the holder pauses or kills the
sandbox it names.

A claim of a session with no sandbox yet is a binding with an empty
sandbox id, held for the create; letting go of it deletes it. Each rule is
applied as one atomic step by every store (`router.state.tables`, and in
Lua: ``router/state/lua/session_*.lua``), and
``tests/state/test_lua_matches_policies.py`` holds the two copies to the
same answers.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

__all__ = ["SessionBinding", "SessionClaim", "bind", "claim", "let_go", "live"]


@dataclass(frozen=True, slots=True)
class SessionBinding:
    """A sticky session's sandbox: where it lives, until when it is kept, whether it
    was paused (a binding written before the field existed reads as not paused), and
    who holds the session now ("" when nobody does)."""

    entry: str
    sandbox_id: str
    expires: float
    paused: bool = False
    holder: str = ""


@dataclass(frozen=True, slots=True)
class SessionClaim:
    """The answer to a claim.

    ``busy``: another holder has the session, and ``binding`` is its binding.
    Otherwise the caller holds the session now, and ``binding`` is the
    sandbox it names as found (None: no sandbox yet, create one).
    """

    busy: bool
    binding: SessionBinding | None = None


def live(row: SessionBinding | None, now: float) -> SessionBinding | None:
    """The binding while it lasts (an expired one is as good as none)."""
    return row if row is not None and row.expires > now else None


def claim(
    row: SessionBinding | None, holder: str, expires: float, now: float
) -> tuple[SessionClaim, SessionBinding | None]:
    """Claim the session for ``holder`` until ``expires``: the answer, and the binding to
    write (None: write nothing, the session is busy).

    The claim lasts only as long as the acquire may (``expires``), not the
    binding's idle time: a claimer that dies lets the session go with it.
    """
    current = live(row, now)
    if current is not None and current.holder not in ("", holder):
        return SessionClaim(True, current), None
    if current is None or not current.sandbox_id:
        return SessionClaim(False), SessionBinding("", "", expires, holder=holder)
    return SessionClaim(False, current), replace(current, expires=expires, holder=holder)


def bind(row: SessionBinding | None, new: SessionBinding, now: float, *, kept: bool) -> bool:
    """Whether ``new`` may be written over ``row``.

    ``kept``: a lease keeping its session (a heartbeat): only while the live
    binding names its sandbox and its holder. Otherwise a new binding: unless
    another holder has the session.
    """
    current = live(row, now)
    if kept:
        return (
            current is not None
            and current.sandbox_id == new.sandbox_id
            and current.holder == new.holder
        )
    return current is None or current.holder in ("", new.holder)


def let_go(
    row: SessionBinding | None,
    holder: str,
    sandbox_id: str,
    expires: float,
    now: float,
    *,
    paused: bool | None = None,
    drop: bool = False,
) -> tuple[bool, SessionBinding | None]:
    """``holder`` lets go of the session: whether it held it, bound to ``sandbox_id``
    when one is given, and the binding left (None: delete it).

    Only the holder lets go: anyone else changes nothing. A binding naming
    ``sandbox_id`` (any, when it is "") stays, unheld, until ``expires``,
    paused as ``paused`` says (None: as it was), unless ``drop``. One naming
    another sandbox, or none (the holder's bind of its sandbox never landed),
    goes, and the answer is False: the holder's sandbox is nobody's to keep.
    """
    current = live(row, now)
    if not holder or current is None or current.holder != holder:
        return False, row
    if sandbox_id and current.sandbox_id != sandbox_id:
        return False, None
    if drop or not current.sandbox_id:
        return True, None
    stays = current.paused if paused is None else paused
    return True, replace(current, expires=expires, holder="", paused=stays)
