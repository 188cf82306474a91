"""One holder at a time: the session rules of `policies.sessions`, against a model that
only knows who holds the session and until when."""

from __future__ import annotations

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from policies.sessions import SessionBinding, SessionClaim, bind, claim, let_go, live

NOW = 1000.0
HOLDERS = st.sampled_from(["h1", "h2", "h3"])
SANDBOXES = st.sampled_from(["sb1", "sb2"])


def test_a_claim_of_a_session_with_no_sandbox_holds_a_placeholder_for_the_create() -> None:
    answer, row = claim(None, "h1", NOW + 30, NOW)
    assert (answer, row) == (SessionClaim(False), SessionBinding("", "", NOW + 30, holder="h1"))
    assert let_go(row, "h1", "", NOW + 900, NOW) == (True, None)  # nothing to keep


def test_a_claim_keeps_the_sandbox_and_lasts_only_as_long_as_the_acquire() -> None:
    kept = SessionBinding("e", "sb1", NOW + 900, paused=True)
    answer, row = claim(kept, "h1", NOW + 30, NOW)
    assert answer == SessionClaim(False, kept)
    assert row == SessionBinding("e", "sb1", NOW + 30, paused=True, holder="h1")
    assert claim(row, "h2", NOW + 40, NOW + 10) == (SessionClaim(True, row), None)
    assert claim(row, "h2", NOW + 60, NOW + 30)[0] == SessionClaim(False)  # it died with h1


def test_only_the_holder_lets_go_and_keeps_only_its_sandbox() -> None:
    row = SessionBinding("e", "sb1", NOW + 30, holder="h1")
    assert let_go(row, "h2", "", NOW + 900, NOW) == (False, row)
    assert let_go(row, "", "", NOW + 900, NOW) == (False, row)
    assert let_go(row, "h1", "sb2", NOW + 900, NOW) == (False, None)  # its bind never landed
    assert let_go(row, "h1", "sb1", NOW + 900, NOW, paused=True) == (
        True,
        SessionBinding("e", "sb1", NOW + 900, paused=True),
    )
    assert let_go(row, "h1", "", NOW + 900, NOW, drop=True) == (True, None)


def test_binding_refused_while_another_holds_it_kept_only_by_the_holder() -> None:
    row = SessionBinding("e", "sb1", NOW + 30, holder="h1")
    assert not bind(row, SessionBinding("e", "sb2", NOW + 60, holder="h2"), NOW, kept=False)
    assert not bind(row, SessionBinding("e", "sb2", NOW + 60), NOW, kept=False)
    assert bind(row, SessionBinding("e", "sb2", NOW + 60, holder="h1"), NOW, kept=False)
    assert bind(row, SessionBinding("e", "sb1", NOW + 60, holder="h1"), NOW, kept=True)
    assert not bind(row, SessionBinding("e", "sb1", NOW + 60), NOW, kept=True)
    assert not bind(row, SessionBinding("e", "sb2", NOW + 60, holder="h1"), NOW, kept=True)
    assert not bind(None, SessionBinding("e", "sb1", NOW + 60), NOW, kept=True)
    assert bind(row, SessionBinding("e", "sb2", NOW + 60), NOW + 30, kept=False)  # h1 died


class OneHolder(RuleBasedStateMachine):
    """Claims, binds, lets go and time passing on one session: a holder's calls succeed
    exactly while the model says it holds the session, and never two hold it at once."""

    def __init__(self) -> None:
        super().__init__()
        self.row: SessionBinding | None = None
        self.now = NOW
        self.owner: str | None = None  # the model: who holds it ...
        self.until = NOW  # ... until when
        self.sandbox = ""  # and the sandbox it names

    def _held_by_other(self, holder: str) -> bool:
        return self.owner not in (None, holder) and self.until > self.now

    @rule(holder=HOLDERS, ttl=st.integers(1, 60))
    def acquire(self, holder: str, ttl: int) -> None:
        answer, row = claim(self.row, holder, self.now + ttl, self.now)
        assert answer.busy == self._held_by_other(holder)
        if answer.busy:
            assert row is None
            assert answer.binding is not None
            assert answer.binding.holder == self.owner
            return
        kept = self.sandbox if self.until > self.now else ""  # what the session still names
        assert (answer.binding.sandbox_id if answer.binding else "") == kept
        self.row, self.owner, self.until, self.sandbox = row, holder, self.now + ttl, kept

    @rule(holder=HOLDERS, sandbox=SANDBOXES, kept=st.booleans(), ttl=st.integers(1, 60))
    def bind_sandbox(self, holder: str, sandbox: str, kept: bool, ttl: int) -> None:
        new = SessionBinding("e", sandbox, self.now + ttl, holder=holder)
        live_owner = self.owner if self.until > self.now else None
        allowed = bind(self.row, new, self.now, kept=kept)
        if kept:
            assert allowed == (live_owner == holder and self.sandbox == sandbox)
        else:
            assert allowed == (not self._held_by_other(holder))
        if allowed:
            self.row, self.owner, self.until, self.sandbox = new, holder, new.expires, sandbox

    @rule(
        holder=HOLDERS,
        sandbox=st.sampled_from(["", "sb1", "sb2"]),
        drop=st.booleans(),
        ttl=st.integers(1, 900),
    )
    def release(self, holder: str, sandbox: str, drop: bool, ttl: int) -> None:
        held, row = let_go(self.row, holder, sandbox, self.now + ttl, self.now, drop=drop)
        holds = self.owner == holder and self.until > self.now
        assert held == (holds and sandbox in ("", self.sandbox))
        if not holds:
            assert row == self.row
            return
        self.row, self.owner = row, None
        if row is None:
            self.sandbox, self.until = "", self.now
        else:
            self.until = row.expires

    @rule(seconds=st.integers(0, 70))
    def advance(self, seconds: int) -> None:
        self.now += seconds

    @invariant()
    def the_binding_names_its_one_holder(self) -> None:
        current = live(self.row, self.now)
        if current is None:
            return
        assert current.holder == (self.owner or "")
        assert current.sandbox_id == self.sandbox


TestOneHolder = OneHolder.TestCase
