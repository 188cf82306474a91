"""A fleet of fail_open replicas through a Redis outage: never past the quota, and
every unit granted during the outage written back once Redis returns."""

from __future__ import annotations

import random
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import redis

from emulators.redis_server import RedisServer
from providers.errors import NoProviderAvailable, StateUnavailable
from router import Event, Router
from router.testing import ScriptedProvider
from tests.forked import processes
from tests.polling import wait_until

pytestmark = pytest.mark.slow

QUOTA = 80
REPLICAS = 8


def config(url: str, tmp: Path) -> dict[str, Any]:
    return {
        "state_url": url + "?socket_timeout=0.3&socket_connect_timeout=0.3",
        "key_prefix": "fleet",
        "on_state_error": "fail_open",
        "fleet_heartbeat": 0.25,
        "fail_open_journal": str(tmp / "journal.db"),
        "chain": [{"name": "only", "provider": "local", "quota": {"sessions": QUOTA}}],
    }


def _replica(cfg: dict[str, Any], root: str, ready: Any, go: Any, stop: Any, granted: Any) -> None:
    """Acquire and release every 0.15 s until told to stop; count what was granted."""
    with Router.from_config(
        cfg, providers={"only": ScriptedProvider("only", Path(root))}, hooks=[]
    ) as router:
        router.acquire().release()  # in the fleet from here on (it heartbeats)
        with granted.get_lock():
            granted.value += 1
            ready.value += 1
        go.wait()
        while not stop.is_set():
            try:
                router.acquire(timeout=5).release()
            except (NoProviderAvailable, StateUnavailable):
                pass
            else:
                with granted.get_lock():
                    granted.value += 1
            time.sleep(0.15)


def test_eight_replicas_through_a_redis_kill_stay_within_quota_and_write_back(
    aof_redis: RedisServer, tmp_path: Path
) -> None:
    ctx = processes(__name__)
    go, stop = ctx.Event(), ctx.Event()
    ready, granted = ctx.Value("i", 0), ctx.Value("i", 0)
    cfg = config(aof_redis.url, tmp_path)
    workers = [
        ctx.Process(target=_replica, args=(cfg, str(tmp_path / f"sb{i}"), ready, go, stop, granted))
        for i in range(REPLICAS)
    ]
    for worker in workers:
        worker.start()
    wait_until(lambda: ready.value == REPLICAS, seconds=120)
    heartbeated(aof_redis.url, "fleet", REPLICAS)  # each has seen the whole fleet
    go.set()
    time.sleep(0.6)  # ~40 sessions granted, the rest left
    before_kill = granted.value
    aof_redis.stop()  # SIGKILL
    time.sleep(4)
    during = granted.value - before_kill
    aof_redis.start()  # same port; the AOF replays
    time.sleep(3)  # heartbeats hand the journals over
    stop.set()
    for worker in workers:
        worker.join(60)
        assert worker.exitcode == 0
    print(f"\nfleet outage: before {before_kill}, during {during}, total {granted.value}")
    assert 0 < before_kill < QUOTA
    assert during > 0  # the outage did not stop the fleet
    assert granted.value <= QUOTA
    with Router.from_config(cfg, providers={"only": ScriptedProvider("only", tmp_path)},
                            hooks=[]) as reader:  # fmt: skip
        assert reader.status().entries[0].used["sessions"] == granted.value


def _fleet_config(url: str, tmp: Path, prefix: str, quota: int, **settings: Any) -> dict[str, Any]:
    return {
        "state_url": url + "?socket_timeout=0.3&socket_connect_timeout=0.3",
        "key_prefix": prefix,
        "on_state_error": "fail_open",
        "fail_open_journal": str(tmp / f"journal-{prefix}.db"),
        "chain": [{"name": "only", "provider": "local", "quota": {"sessions": quota}}],
        **settings,
    }


def _router(cfg: dict[str, Any], root: Path, events: list[Event] | None = None) -> Router:
    hooks = [] if events is None else [events.append]
    return Router.from_config(cfg, providers={"only": ScriptedProvider("only", root)}, hooks=hooks)


def fleet_settled(url: str, prefix: str, replicas: int = 1) -> bool:
    """``replicas`` are registered and each has registered since the last of them joined:
    every one's view of the fleet is settled (its share of an outage is known)."""
    with redis.Redis.from_url(url) as admin:
        rows = [v.split() for v in admin.hgetall(f"{{{prefix}:fleet}}:members").values()]
    staying = [row for row in rows if row[4] == b"0"]
    return len(staying) == replicas and min(int(r[1]) for r in staying) > max(
        int(r[0]) for r in staying
    )


def heartbeated(url: str, prefix: str, replicas: int = 1) -> None:
    """Wait until the fleet is settled and every replica has heartbeated since: each one's
    share of an outage is known then (settled alone was not enough under load)."""
    wait_until(lambda: fleet_settled(url, prefix, replicas), seconds=60)
    with redis.Redis.from_url(url) as admin:
        settled_at = int(admin.get(f"{{{prefix}:fleet}}:seq") or 0)
        wait_until(
            lambda: int(admin.get(f"{{{prefix}:fleet}}:seq") or 0) >= settled_at + 2 * replicas
        )


def _drain(router: Router) -> tuple[int, str]:
    """Acquire and release until refused: how many were served, and why it stopped."""
    served = 0
    while True:
        try:
            router.acquire(timeout=5).release()
        except NoProviderAvailable as refusal:
            return served, str(refusal)
        served += 1


def test_replicas_that_start_together_and_lose_the_store_before_their_second_heartbeat(
    aof_redis: RedisServer, tmp_path: Path
) -> None:
    """Each saw the fleet as it was when it registered (the first alone): none may
    divide what was left by that."""
    cfg = _fleet_config(aof_redis.url, tmp_path, "together", 20, fleet_heartbeat=30)
    routers = [_router(cfg, tmp_path / f"sb{i}") for i in range(6)]
    try:
        for router in routers:
            router.acquire().release()  # its first contact, then a grant
        aof_redis.stop()
        drained = [_drain(router) for router in routers]
    finally:
        for router in routers:
            router.close()
    print(f"\nstarted together: {sum(n for n, _ in drained)} granted in the outage, 14 left")
    assert sum(n for n, _ in drained) == 0  # none had a settled view of the fleet
    assert all("has not seen the fleet" in why for _, why in drained)


def test_a_process_started_during_the_outage_grants_nothing_and_says_why(
    aof_redis: RedisServer, tmp_path: Path
) -> None:
    cfg = _fleet_config(aof_redis.url, tmp_path, "newcomer", 20, fleet_heartbeat=0.25)
    with _router(cfg, tmp_path / "a") as old:
        old.acquire().release()
        aof_redis.stop()
        with _router(cfg, tmp_path / "b") as new:
            served, why = _drain(new)
    assert served == 0
    assert "never reached the store" in why
    assert "fail_open_blind 0" in why
    opted = {**cfg, "fail_open_blind": 0.1}
    with _router(opted, tmp_path / "c") as blind:
        served, why = _drain(blind)
    assert served == 2  # 10 % of the limit of 20, on top of the fleet's shares
    assert "blind share (fail_open_blind 0.1 of each limit) is used up: sessions 2/2" in why


RUNS = 6
RANDOM_QUOTA = 40


class _Replica(threading.Thread):
    """A router that starts at ``start`` seconds into the run, acquires and releases
    every 50-100 ms, and ends at ``end`` or when the run stops."""

    def __init__(self, trial: _Trial, name: str, start: float, end: float | None = None) -> None:
        super().__init__(name=name, daemon=True)
        self.trial = trial
        self.start_at, self.end_at = start, end
        self.granted = 0
        self.pace = random.Random(name).uniform(0.05, 0.1)

    def run(self) -> None:
        trial = self.trial
        if trial.stop.wait(max(0.0, self.start_at - trial.elapsed())):
            return
        with _router(trial.cfg, trial.tmp / self.name, trial.events) as router:
            while not trial.stop.is_set():
                if self.end_at is not None and trial.elapsed() >= self.end_at:
                    break  # this replica ends (perhaps during the outage)
                try:
                    router.acquire(timeout=2).release()
                except (NoProviderAvailable, StateUnavailable):
                    pass
                else:
                    self.granted += 1
                trial.stop.wait(self.pace)


class _Trial:
    def __init__(self, seed: int, redis: RedisServer, tmp: Path) -> None:
        rng = random.Random(seed)
        self.prefix = f"random-{seed}"
        self.cfg = _fleet_config(redis.url, tmp, self.prefix, RANDOM_QUOTA, fleet_heartbeat=0.2)
        self.tmp, self.redis = tmp / self.prefix, redis
        self.events: list[Event] = []
        self.stop = threading.Event()
        self.kill_at, self.outage = rng.uniform(0.05, 1.0), rng.uniform(0.3, 0.8)
        self.replicas = [_Replica(self, f"r{i}", rng.uniform(0.0, 0.4)) for i in range(4)]
        self.replicas.append(_Replica(self, "leaver", rng.uniform(0.0, 0.3), rng.uniform(0.1, 1.5)))
        self.replicas.append(_Replica(self, "latecomer", self.kill_at + 0.1))
        self.began = time.monotonic()
        self.before = 0

    def elapsed(self) -> float:
        return time.monotonic() - self.began

    def play(self) -> tuple[int, int, int]:
        """Granted in all, during the outage (handed over), and the ledger's count after."""
        for replica in self.replicas:
            replica.start()
        self.stop.wait(max(0.0, self.kill_at - self.elapsed()))
        self.before = sum(r.granted for r in self.replicas)  # (give or take one in flight)
        self.redis.stop()  # SIGKILL
        self.stop.wait(self.outage)
        self.redis.start()  # the AOF replays
        self.stop.wait(1.4)  # the replicas serve their shares on, hand over, go back
        self.stop.set()
        for replica in self.replicas:
            replica.join(30)
            assert not replica.is_alive()
        with _router(self.cfg, self.tmp / "reader", self.events) as reader:
            used = reader.status().entries[0].used["sessions"]  # hands over what is left
        during = sum(e.fields["sessions"] for e in self.events if e.name == "outage_handed_over")
        return sum(r.granted for r in self.replicas), int(during), int(used)


def test_the_store_killed_at_random_points_never_lets_the_fleet_past_the_quota(
    aof_redis: RedisServer, tmp_path: Path
) -> None:
    """Replicas starting at random times (some before their second heartbeat when the
    store goes), one leaving at a random time, one starting during the outage."""
    results = []
    for seed in range(RUNS):
        trial = _Trial(seed, aof_redis, tmp_path)
        total, during, used = trial.play()
        left = RANDOM_QUOTA - trial.before
        results.append((seed, round(trial.kill_at, 2), left, during, total, used))
    print("\nseed, kill at (s), left at the kill, granted during, total, ledger after:")
    for row in results:
        print(*row)
    for seed, _, _, _, total, used in results:
        assert total <= RANDOM_QUOTA, f"run {seed}: {total} granted of {RANDOM_QUOTA}"
        assert used >= total, f"run {seed}: the ledger counts {used} of {total} granted"


def test_a_registry_the_store_lost_is_rebuilt_and_the_share_counts_all_own_spend(
    redis_url: str, key_prefix: str, tmp_path: Path
) -> None:
    """The registry's sequence starts again at 1 (the store lost its data): the replica
    keeps registering, and until its spans are past the new numbers it counts all it
    spent against its share."""
    cfg = _fleet_config(redis_url, tmp_path, key_prefix, 20, fleet_heartbeat=0.1)
    with _router(cfg, tmp_path / "a") as router:
        router.acquire().release()
        with redis.Redis.from_url(redis_url) as admin:
            seq = f"{{{key_prefix}:fleet}}:seq"
            wait_until(lambda: int(admin.get(seq) or 0) >= 5)  # a few heartbeats in
            admin.delete(f"{{{key_prefix}:fleet}}:members", seq)
        wait_until(lambda: fleet_settled(redis_url, key_prefix), seconds=10)
        assert fleet_settled(redis_url, key_prefix)  # its heartbeat lived through it
        router.acquire().release()
