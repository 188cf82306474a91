"""The pipelined script connection, against real redis-server processes.

It replaces redis-py on the hot path, so it must do what redis-py did there:
authenticate and select the database from the URL, reload a flushed script,
reconnect after a dropped connection, give up on a silent server within the
timeout, keep replies matched to callers when calls overlap or are
cancelled, and raise redis-py's exceptions.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from redis import exceptions as redis_errors

from emulators.redis_server import RedisServer
from policies.breaker import BreakerConfig
from policies.quota import Limits, MonthlyWindow
from providers.errors import ConfigError
from router.state import EntryRef, open_store
from router.state.redis import RedisStore
from router.state.resp import ScriptConnection, supports
from router.state.scripts import RedisPyRunner, RunnerName
from tests.polling import until

ECHO = "redis.call('SET', KEYS[1], ARGV[1]) return ARGV[1]"
ECHO_SHA = hashlib.sha1(ECHO.encode()).hexdigest()


async def echo(conn: ScriptConnection, value: str, key: str = "k") -> bytes:
    reply: bytes = await conn.evalsha(ECHO_SHA, ECHO, [key], [value])
    return reply


async def posted(conn: ScriptConnection, value: str, key: str = "k") -> bytes:
    """`echo`, sent with `ScriptConnection.post` (its answer is the reply)."""
    reply: bytes = await conn.post(ECHO_SHA, ECHO, [key], [value], lambda call: call.result())
    return reply


@pytest.fixture
def secured(tmp_path: Path) -> Iterator[RedisServer]:
    sock = tmp_path / "redis.sock"
    args = ("--requirepass", "s3cret", "--unixsocket", str(sock), "--unixsocketperm", "700")
    with RedisServer(tmp_path, args=args) as server:
        yield server


async def test_password_and_database_come_from_the_url(secured: RedisServer) -> None:
    conn = ScriptConnection(f"redis://:s3cret@127.0.0.1:{secured.port}/3")
    assert await echo(conn, "hello", "in-db-3") == b"hello"
    await conn.aclose()
    check = redis.Redis(port=secured.port, password="s3cret", db=3)
    assert check.get("in-db-3") == b"hello"
    assert redis.Redis(port=secured.port, password="s3cret", db=0).get("in-db-3") is None


async def test_unix_socket_with_a_database(secured: RedisServer, tmp_path: Path) -> None:
    conn = ScriptConnection(f"unix://:s3cret@{tmp_path / 'redis.sock'}?db=2")
    assert await echo(conn, "via-socket", "sock") == b"via-socket"
    await conn.aclose()
    assert redis.Redis(port=secured.port, password="s3cret", db=2).get("sock") == b"via-socket"


async def test_a_wrong_password_is_an_authentication_error(secured: RedisServer) -> None:
    conn = ScriptConnection(f"redis://:wrong@127.0.0.1:{secured.port}/0")
    with pytest.raises(redis_errors.AuthenticationError, match=r"WRONGPASS|invalid"):
        await echo(conn, "x")


async def test_a_flushed_script_is_reloaded(redis_url: str) -> None:
    conn = ScriptConnection(redis_url)
    assert await echo(conn, "one") == b"one"
    redis.Redis.from_url(redis_url).script_flush()
    assert await echo(conn, "two") == b"two"
    await conn.aclose()


async def test_a_killed_connection_is_replaced(redis_url: str) -> None:
    conn = ScriptConnection(redis_url)
    await echo(conn, "before")
    admin = redis.Redis.from_url(redis_url)
    assert admin.client_kill_filter(_type="normal", skipme=True) >= 1
    assert await echo(conn, "after") == b"after"
    await conn.aclose()


async def test_a_restarted_server_is_reconnected(tmp_path: Path) -> None:
    with RedisServer(tmp_path) as server:
        conn = ScriptConnection(server.url)
        await echo(conn, "before")
        server.restart()
        assert await echo(conn, "after") == b"after"
        server.stop()
        with pytest.raises(redis_errors.ConnectionError):
            await echo(conn, "down")
        await conn.aclose()


async def test_a_silent_server_times_out_and_the_next_call_works(redis_url: str) -> None:
    conn = ScriptConnection(redis_url + "?socket_timeout=0.2")
    await echo(conn, "warm")
    admin = redis.Redis.from_url(redis_url)
    admin.execute_command("CLIENT", "PAUSE", "1200", "ALL")
    started = time.monotonic()
    with pytest.raises(redis_errors.TimeoutError, match=r"within 0\.2s"):
        await echo(conn, "paused")
    assert time.monotonic() - started < 1.2  # three tries of 0.2 s plus backoff
    await asyncio.sleep(1.3 - (time.monotonic() - started))
    assert await echo(conn, "resumed") == b"resumed"
    await conn.aclose()


async def test_overlapping_calls_share_one_socket_and_get_their_own_replies(
    tmp_path: Path,
) -> None:
    with RedisServer(tmp_path) as server:
        conn = ScriptConnection(server.url)
        replies = await asyncio.gather(*(echo(conn, f"v{i}", f"k{i}") for i in range(200)))
        assert replies == [f"v{i}".encode() for i in range(200)]
        clients = redis.Redis.from_url(server.url).client_list()
        others = [c for c in clients if c["cmd"] not in ("client|list", "client")]  # 7, 6
        assert len(others) == 1
        await conn.aclose()


async def test_a_cancelled_call_does_not_shift_the_replies(redis_url: str) -> None:
    conn = ScriptConnection(redis_url)
    await echo(conn, "warm")
    first = asyncio.ensure_future(echo(conn, "first"))
    await asyncio.sleep(0)  # written, reply not read yet
    first.cancel()
    assert await echo(conn, "second") == b"second"
    await conn.aclose()


async def test_a_script_error_is_a_response_error_and_the_socket_stays(redis_url: str) -> None:
    conn = ScriptConnection(redis_url)
    bad = "return redis.error_reply('ERR the script said no')"
    with pytest.raises(redis_errors.ResponseError, match="the script said no"):
        await conn.evalsha(hashlib.sha1(bad.encode()).hexdigest(), bad, [], [])
    assert await echo(conn, "still fine") == b"still fine"
    await conn.aclose()


def test_each_event_loop_gets_its_own_socket(redis_url: str) -> None:
    conn = ScriptConnection(redis_url)
    assert asyncio.run(echo(conn, "loop one")) == b"loop one"
    assert asyncio.run(echo(conn, "loop two")) == b"loop two"


def test_floats_travel_at_full_precision(redis_url: str) -> None:
    conn = ScriptConnection(redis_url)
    now = 1_795_429_692.3586786
    assert asyncio.run(echo(conn, repr(now))) == repr(now).encode()
    script = "return tostring(tonumber(ARGV[1]) * 2)"
    doubled = asyncio.run(
        conn.evalsha(hashlib.sha1(script.encode()).hexdigest(), script, [], [now])
    )
    assert float(doubled) == pytest.approx(now * 2, abs=1e-4)


@pytest.mark.parametrize(
    ("url", "served"),
    [
        ("redis://127.0.0.1:6379/0", True),
        ("rediss://h:6380/0?ssl_ca_certs=/ca.pem&ssl_cert_reqs=required", True),
        ("unix:///run/redis.sock?db=1", True),
        ("redis://h/0?socket_timeout=1&max_connections=8", True),
        ("redis://h/0?health_check_interval=5", False),  # an option only redis-py knows
        ("redis+sentinel://h:26379/mymaster", False),
        ("redis+cluster://h:7000", False),
    ],
)
def test_which_urls_it_serves(url: str, served: bool) -> None:
    assert supports(url) is served


async def test_a_closed_store_leaves_no_connection_open(tmp_path: Path) -> None:
    """Both halves close: the script socket and redis-py's pool (which the client owns)."""
    with RedisServer(tmp_path) as server:
        admin = redis.Redis(port=server.port)
        before = admin.info("clients")["connected_clients"]
        store = open_store(server.url, "closing")
        ref = EntryRef("a", "p", Limits(sessions=5), MonthlyWindow(), fingerprint="f")
        assert (await store.reserve(ref, BreakerConfig(), "l1", 1e9, 30)).granted  # script socket
        await asyncio.gather(*(store.snapshot([ref], 1e9) for _ in range(3)))  # pooled
        assert admin.info("clients")["connected_clients"] > before
        await store.close()
        await until(lambda: admin.info("clients")["connected_clients"] == before)
        assert admin.info("clients")["connected_clients"] == before
        admin.close()


@pytest.mark.parametrize(
    ("url", "kind", "chosen"),
    [
        ("redis://127.0.0.1:6379/0", "auto", ScriptConnection),
        ("redis://127.0.0.1:6379/0", "redis-py", RedisPyRunner),
        ("redis://h/0?health_check_interval=5", "auto", RedisPyRunner),
        ("redis+cluster://h:7000", "auto", RedisPyRunner),
    ],
)
async def test_the_store_chooses_its_script_runner(
    url: str, kind: RunnerName, chosen: type
) -> None:
    store = RedisStore(url, "choice", runner=kind)
    assert isinstance(store._runner, chosen)
    await store.close()


def test_the_lean_runner_refuses_a_url_it_cannot_serve() -> None:
    with pytest.raises(ConfigError, match="serves redis://"):
        RedisStore("redis+sentinel://h:26379/main", "choice", runner="resp")


async def test_a_posted_call_is_sent_before_post_returns(redis_url: str) -> None:
    """On a live socket the call needs no task: it is written at once and lands in order."""
    conn = ScriptConnection(redis_url)
    assert await posted(conn, "first call connects") == b"first call connects"
    tasks = len(asyncio.all_tasks())
    calls = [
        conn.post(ECHO_SHA, ECHO, [f"p{i}"], [f"v{i}"], lambda c: c.result()) for i in range(50)
    ]
    assert len(asyncio.all_tasks()) == tasks
    assert await asyncio.gather(*calls) == [f"v{i}".encode() for i in range(50)]
    await conn.aclose()


async def test_a_posted_call_reloads_a_flushed_script(redis_url: str) -> None:
    conn = ScriptConnection(redis_url)
    assert await posted(conn, "one") == b"one"
    redis.Redis.from_url(redis_url).script_flush()
    assert await posted(conn, "two") == b"two"
    await conn.aclose()


async def test_a_posted_call_on_a_killed_connection_is_sent_again(redis_url: str) -> None:
    conn = ScriptConnection(redis_url)
    await posted(conn, "before")
    admin = redis.Redis.from_url(redis_url)
    assert admin.client_kill_filter(_type="normal", skipme=True) >= 1
    assert await posted(conn, "after", "after") == b"after"
    assert admin.get("after") == b"after"
    await conn.aclose()


async def test_a_posted_call_to_a_stopped_server_fails_with_redis_errors(tmp_path: Path) -> None:
    with RedisServer(tmp_path) as server:
        conn = ScriptConnection(server.url)
        await posted(conn, "up")
        server.stop()
        with pytest.raises(redis_errors.ConnectionError):
            await posted(conn, "down")
        await conn.aclose()


async def test_a_posted_call_hands_errors_to_its_answer(redis_url: str) -> None:
    """A script's error reply reaches ``answer`` as the call's exception; what ``answer``
    raises is the future's."""
    conn = ScriptConnection(redis_url)
    bad = "return redis.error_reply('ERR the script said no')"
    bad_sha = hashlib.sha1(bad.encode()).hexdigest()
    seen: list[BaseException | None] = []

    def answer(call: asyncio.Future[object]) -> str:
        seen.append(call.exception())
        raise ValueError("the answer could not be read")

    await posted(conn, "connects")
    with pytest.raises(ValueError, match="could not be read"):
        await conn.post(bad_sha, bad, [], [], answer)
    assert isinstance(seen[0], redis_errors.ResponseError)
    assert "the script said no" in str(seen[0])
    assert await posted(conn, "still fine") == b"still fine"
    await conn.aclose()


async def test_posted_and_awaited_calls_keep_their_replies(redis_url: str) -> None:
    conn = ScriptConnection(redis_url)
    await echo(conn, "warm")
    mixed = [
        posted(conn, f"p{i}", f"k{i}") if i % 2 else echo(conn, f"e{i}", f"k{i}") for i in range(40)
    ]
    replies = await asyncio.gather(*mixed)
    assert replies == [(f"p{i}" if i % 2 else f"e{i}").encode() for i in range(40)]
    await conn.aclose()
