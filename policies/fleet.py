"""The fleet registry: which replicas a fail_open replica must share an outage with.

Each fail_open replica registers in the shared store every heartbeat; what
it learns there decides how it divides what was left when the store goes
away (`policies.outage`). Dividing by a fleet too small overspends: a
replica that registered before the others had (a fleet starting together)
saw itself alone. So the registry orders every contact by a sequence number
of its own (the store's order, not the replicas' clocks) and tells each
replica, besides the fleet's size:

* ``joined``: the number of its first contact (of this membership);
* ``oldest``: the oldest latest contact among the members that may still
  serve (itself included).

Once ``oldest`` is past ``joined``, every such member has registered since
this one joined, and so counts it: the view is *settled*. Two settled
replicas always count each other (the later of the two joined before the
earlier one's latest contact, or the earlier one has dropped out of the
registry), so no settled replica's fleet is smaller than the number of
settled replicas. A replica whose view is not settled has not been seen
by the whole fleet and takes no share of what was left.

A member that misses its heartbeats, or leaves, is still counted for one
more TTL ("recently seen"): a late heartbeat never shrinks the fleet, and
the share a replica that just left did not take is room for what it spent
before leaving. One that left no longer holds back ``oldest`` (it will not
serve).

Pure rules over a mapping of members; `router.state.tables` applies them
in one transaction and `lua/register.lua` / `deregister.lua` mirror them
(`tests/state/test_lua_matches_policies.py` keeps the two the same).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

__all__ = ["Member", "Registration", "deregister", "register"]


@dataclass(frozen=True, slots=True)
class Member:
    """One replica in the registry.

    Attributes:
        joined / last: sequence numbers of its first and its latest contact.
        expires: it is live until then (the registering router's clock).
        ttl: its registration's TTL; it is counted until ``expires + ttl``.
        left: it deregistered (a clean shutdown): it will not serve.
    """

    joined: int
    last: int
    expires: float
    ttl: float
    left: bool = False

    def recent(self, now: float) -> bool:
        return now < self.expires + self.ttl


@dataclass(frozen=True, slots=True)
class Registration:
    """What one contact with the registry tells the replica that made it.

    Attributes:
        replicas: members live or seen within the last TTL, the caller included.
        seq: this contact's number in the registry's order.
        joined: the caller's first contact of its current membership.
        oldest: the oldest latest contact among members that may still serve.
    """

    replicas: int
    seq: int
    joined: int
    oldest: int

    @property
    def settled(self) -> bool:
        """Every member that may serve has registered since this replica joined."""
        return self.oldest > self.joined


def register(
    members: Mapping[str, Member], seq: int, replica: str, now: float, ttl: float
) -> tuple[dict[str, Member], Registration]:
    """``replica``'s contact number ``seq`` (the registry's next) at ``now``: the members
    after it (those not seen for a TTL past their expiry dropped) and what it learns."""
    kept = {name: m for name, m in members.items() if m.recent(now)}
    me = kept.get(replica)
    joined = me.joined if me is not None and not me.left else seq
    kept[replica] = Member(joined, seq, now + ttl, ttl)
    oldest = min(m.last for m in kept.values() if not m.left)
    return kept, Registration(len(kept), seq, joined, oldest)


def deregister(members: Mapping[str, Member], replica: str, now: float) -> dict[str, Member]:
    """``replica`` leaves at ``now``: counted one TTL more, no longer holding back ``oldest``."""
    out = dict(members)
    me = out.get(replica)
    if me is not None:
        out[replica] = replace(me, expires=min(me.expires, now), left=True)
    return out
