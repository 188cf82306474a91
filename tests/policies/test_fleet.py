"""The fleet registry and the outage shares it leads to: whatever each replica has seen
when the store goes away, the fleet's shares never add up to more than was left."""

from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from policies.fleet import Member, Registration, deregister, register
from policies.outage import Contact, OutageShare, outage_limits, spent_since
from policies.quota import Limits

TTL = 3.0
NAMES = [f"r{i}" for i in range(4)]


def test_the_first_contact_is_never_settled_and_the_second_is_once_all_have_seen_it() -> None:
    members: dict[str, Member] = {}
    views = {}
    for seq, name in enumerate(["a", "b", "c"], start=1):  # three replicas start together
        members, views[name] = register(members, seq, name, 0.0, TTL)
    assert [v.replicas for v in views.values()] == [1, 2, 3]  # a saw itself alone
    assert not any(v.settled for v in views.values())
    members, again = register(members, 4, "a", 0.5, TTL)
    assert again == Registration(replicas=3, seq=4, joined=1, oldest=2)
    assert again.settled  # b and c registered after a joined: both count a
    members, b = register(members, 5, "b", 0.6, TTL)
    assert (b.oldest, b.settled) == (3, True)  # c's first contact, after b joined, counted b
    members, c = register(members, 6, "c", 0.7, TTL)
    assert (c.oldest, c.settled) == (4, True)


def test_a_late_or_leaving_member_is_counted_one_ttl_more() -> None:
    members: dict[str, Member] = {}
    members, _ = register(members, 1, "a", 0.0, TTL)
    members, _ = register(members, 2, "b", 0.0, TTL)
    members = deregister(members, "b", 1.0)
    members, a = register(members, 3, "a", 2.0, TTL)
    assert (a.replicas, a.oldest) == (2, 3)  # b counted, but no longer holds a back
    members, a = register(members, 4, "a", 4.1, TTL)
    assert a.replicas == 1  # b left at 1.0: counted until 4.0
    members, _ = register(members, 5, "c", 4.1, TTL)  # c then misses its heartbeats
    members, a = register(members, 6, "a", 7.0, TTL)
    assert (a.replicas, a.oldest, a.settled) == (2, 5, True)
    members, c = register(members, 7, "c", 10.5, TTL)  # dropped at 10.1: c joins anew...
    assert (c.joined, c.oldest, c.settled) == (7, 6, False)  # ...and a has not seen it


def test_spend_since_the_fleet_s_oldest_contact_is_taken_off_whoever_made_it() -> None:
    """b spends 4 and registers again; a's last contact is older and misses that spend,
    so b's share takes all 4 off (not only what it spent since its own contact)."""
    members: dict[str, Member] = {}
    members, _ = register(members, 1, "a", 0.0, TTL)
    members, b1 = register(members, 2, "b", 0.0, TTL)
    members, a = register(members, 3, "a", 0.5, TTL)
    members, b2 = register(members, 4, "b", 0.5, TTL)
    members, b3 = register(members, 5, "b", 1.0, TTL)  # after spending 4
    assert (a.settled, b3.settled, b3.oldest) == (True, True, 3)
    spans = [(0, {}), (b1.seq, {}), (b2.seq, {"p": {"sessions": 4.0}}), (b3.seq, {})]
    own = spent_since(spans, b3.oldest, "p")
    assert own == {"sessions": 4.0}
    limits = Limits(sessions=20)
    share_a = outage_limits(limits, "p", Contact(a, {"p": {"sessions": 0.0}}), OutageShare())
    share_b = outage_limits(limits, "p", Contact(b3, {"p": {"sessions": 4.0}}), OutageShare(), own)
    assert (share_a.sessions, share_b.sessions) == (10, 4)  # 14 of the 16 left


def test_deregistering_an_unknown_replica_changes_nothing() -> None:
    assert deregister({}, "ghost", 1.0) == {}


@dataclass
class Replica:
    """One replica in the model: what it saw and what it spent."""

    contact: Contact | None = None
    spans: list[tuple[int, dict[str, dict[str, float]]]] = field(default_factory=lambda: [(0, {})])
    spent: list[tuple[int, int]] = field(default_factory=list)  # (registry seq then, units)
    left: bool = False
    seen_at: dict[int, float] = field(default_factory=dict)  # contact seq -> usage then


class FleetOutage(RuleBasedStateMachine):
    """Replicas join, heartbeat, spend from the shared ledger and leave in any order;
    at every step the store may go away: the invariants check the shares then."""

    def __init__(self) -> None:
        super().__init__()
        self.members: dict[str, Member] = {}
        self.seq = 0
        self.now = 0.0
        self.used = 0
        self.replicas: dict[str, Replica] = {}

    @initialize(limit=st.integers(0, 80), expected=st.integers(1, 10))
    def setup(self, limit: int, expected: int) -> None:
        self.limit = limit
        self.share = OutageShare(expected=expected)

    def _contact(self, name: str) -> None:
        self.seq += 1
        self.members, fleet = register(self.members, self.seq, name, self.now, TTL)
        replica = self.replicas.setdefault(name, Replica())
        usage = {"p": {"sessions": float(self.used)}}
        replica.contact = Contact(fleet, usage)
        replica.seen_at[fleet.seq] = self.used
        first = max(i for i, (seq, _) in enumerate(replica.spans) if seq <= fleet.oldest)
        replica.spans = [*replica.spans[first:], (fleet.seq, {})]

    def _serving(self) -> list[str]:
        return [n for n, r in self.replicas.items() if not r.left]

    @rule(name=st.sampled_from(NAMES))
    def join_or_heartbeat(self, name: str) -> None:
        if name not in self.replicas or not self.replicas[name].left:
            self._contact(name)

    @precondition(lambda self: bool(self._serving()))
    @rule(data=st.data())
    def leave(self, data: st.DataObject) -> None:
        name = data.draw(st.sampled_from(self._serving()))
        self.members = deregister(self.members, name, self.now)
        self.replicas[name].left = True

    @precondition(lambda self: bool(self._serving()))
    @rule(data=st.data(), units=st.integers(1, 6))
    def spend(self, data: st.DataObject, units: int) -> None:
        name = data.draw(st.sampled_from(self._serving()))
        units = min(units, self.limit - self.used)  # the shared ledger grants within the limit
        if units <= 0:
            return
        self.used += units
        replica = self.replicas[name]
        replica.spent.append((self.seq, units))
        sessions = replica.spans[-1][1].setdefault("p", {})
        sessions["sessions"] = sessions.get("sessions", 0.0) + units

    @rule(seconds=st.floats(0.0, TTL))
    def wait(self, seconds: float) -> None:
        self.now += seconds

    def _shares(self) -> dict[str, tuple[int, Contact, float]]:
        """Who serves if the store goes away now: its share, its contact, its own spend."""
        out = {}
        for name, replica in self.replicas.items():
            contact = replica.contact
            member = self.members.get(name)
            if replica.left or contact is None or member is None or not member.recent(self.now):
                continue  # gone, or dropped from the registry (a replica cut off alone)
            own = spent_since(replica.spans, contact.fleet.oldest, "p")
            limits = outage_limits(Limits(sessions=self.limit), "p", contact, self.share, own)
            assert limits.sessions is not None
            if contact.fleet.settled:
                out[name] = (limits.sessions, contact, own.get("sessions", 0.0))
            else:
                assert limits.sessions == 0  # blind: 0 by default
        return out

    @invariant()
    def settled_replicas_count_each_other(self) -> None:
        shares = self._shares()
        total = sum(1 / self.share.divisor(c.fleet.replicas) for _, c, _ in shares.values())
        assert total <= 1 + 1e-9

    @invariant()
    def the_shares_never_add_up_to_more_than_was_left(self) -> None:
        shares = self._shares()
        if not shares:
            return
        earliest = min(c.fleet.seq for _, c, _ in shares.values())
        # What the shares cannot see: spend after the earliest serving contact by a
        # replica that will not serve, and spend beyond a replica's own share.
        unseen = sum(
            units
            for name, replica in self.replicas.items()
            if name not in shares
            for seq, units in replica.spent
            if seq >= earliest
        )
        beyond = sum(
            max(0.0, own - (self.limit - c.used["p"]["sessions"]) * self.share.fraction(
                c.fleet.replicas))
            for _, c, own in shares.values()
        )  # fmt: skip
        left = self.limit - self.used
        assert sum(s for s, _, _ in shares.values()) <= left + unseen + beyond + 1e-9
        if unseen == 0 and beyond == 0:
            assert sum(s for s, _, _ in shares.values()) <= left


FleetOutage.TestCase.settings = settings(max_examples=400, stateful_step_count=40, deadline=None)
test_the_fleet_s_shares_stay_within_what_was_left = FleetOutage.TestCase
