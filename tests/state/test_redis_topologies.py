"""The Redis store over TLS, through Sentinel, and on a Redis Cluster.

Each topology is started for real with the ``redis-server`` on PATH (TLS
certificates from ``openssl``, a 3-master cluster joined with ``redis-cli``)
and the same decisions are checked through it, including a full acquire.
"""

from __future__ import annotations

import random
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from policies.breaker import BreakerConfig, Outcome
from policies.paused import PausedHold
from policies.quota import Limits, Meter, MonthlyWindow
from policies.tenants import TenantLimits
from policies.warm import WarmRecord
from providers.errors import ConfigError, NoProviderAvailable, StateUnavailable
from router import Router
from router.events import StateWarning
from router.state import EntryRef, TenantRef, open_store
from router.state.redis import RedisStore
from router.state.scripts import RunnerName

pytestmark = pytest.mark.skipif(
    not (shutil.which("redis-server") and shutil.which("redis-cli")),
    reason="needs redis-server and redis-cli on PATH",
)
NOW = 1_790_000_000.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def cluster_port() -> int:
    """A free port whose cluster-bus twin (port + 10000) is free too."""
    rng = random.Random()
    while True:
        port = rng.randrange(20000, 40000)
        try:
            for p in (port, port + 10000):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", p))
        except OSError:
            continue
        return port


def wait_port(port: int) -> None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"nothing listening on {port}")


class Processes:
    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.procs: list[subprocess.Popen[bytes]] = []

    def redis(self, *args: str, port: int | None = None) -> None:
        self.procs.append(
            subprocess.Popen(
                [
                    "redis-server",
                    *args,
                    "--save",
                    "",
                    "--appendonly",
                    "no",
                    "--dir",
                    str(self.workdir),
                    "--bind",
                    "127.0.0.1",
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        )
        if port:
            wait_port(port)

    def stop(self) -> None:
        for proc in self.procs:
            proc.kill()
            proc.wait()


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[Processes]:
    p = Processes(tmp_path)
    yield p
    p.stop()


def certificate(
    tmp_path: Path, name: str, san: str, ca: tuple[Path, Path] | None = None
) -> tuple[Path, Path]:
    """A key and certificate for ``san``: self-signed, or issued by ``ca`` (key, cert)."""
    key, cert = tmp_path / f"{name}.key", tmp_path / f"{name}.pem"
    subject = ["-nodes", "-keyout", str(key), "-subj", f"/CN={name}"]
    if ca is None:
        openssl("req", "-x509", "-newkey", "rsa:2048", *subject, "-out", str(cert),
                "-days", "1", "-addext", f"subjectAltName={san}")  # fmt: skip
        return key, cert
    csr, ext = tmp_path / f"{name}.csr", tmp_path / f"{name}.ext"
    ext.write_text(f"subjectAltName={san}\n")
    openssl("req", "-newkey", "rsa:2048", *subject, "-out", str(csr))
    openssl("x509", "-req", "-in", str(csr), "-CA", str(ca[1]), "-CAkey", str(ca[0]),
            "-CAcreateserial", "-out", str(cert), "-days", "1", "-extfile", str(ext))  # fmt: skip
    return key, cert


def openssl(*args: str) -> None:
    if not shutil.which("openssl"):
        pytest.skip("needs the openssl command to make certificates")
    subprocess.run(["openssl", *args], check=True, capture_output=True)


def tls_server(procs: Processes, key: Path, cert: Path, ca: Path) -> int:
    """A redis-server speaking only TLS with ``cert``; skips if it was built without TLS."""
    port = free_port()
    try:
        procs.redis("--port", "0", "--tls-port", str(port), "--tls-cert-file", str(cert),
                    "--tls-key-file", str(key), "--tls-ca-cert-file", str(ca),
                    "--tls-auth-clients", "no", port=port)  # fmt: skip
    except RuntimeError:
        if procs.procs[-1].poll() is not None:
            pytest.skip("the redis-server on PATH was built without TLS (BUILD_TLS=yes)")
        raise
    return port


def tls_url(procs: Processes, tmp_path: Path) -> str:
    key, cert = certificate(tmp_path, "127.0.0.1", "IP:127.0.0.1")
    port = tls_server(procs, key, cert, cert)
    return f"rediss://127.0.0.1:{port}/0?ssl_ca_certs={cert}&ssl_cert_reqs=required"


def sentinel_url(procs: Processes, tmp_path: Path) -> str:
    master, sentinel = free_port(), free_port()
    procs.redis("--port", str(master), port=master)
    conf = tmp_path / "sentinel.conf"
    conf.write_text(
        f"port {sentinel}\nbind 127.0.0.1\nsentinel monitor main 127.0.0.1 {master} 1\n"
    )
    procs.procs.append(
        subprocess.Popen(
            ["redis-server", str(conf), "--sentinel"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
    )
    wait_port(sentinel)
    return f"redis+sentinel://127.0.0.1:{sentinel}/main/0"


def cluster_url(procs: Processes, tmp_path: Path) -> str:
    ports = [cluster_port() for _ in range(3)]
    for port in ports:
        node = tmp_path / str(port)
        node.mkdir()
        procs.procs.append(
            subprocess.Popen(
                [
                    "redis-server",
                    "--port",
                    str(port),
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    str(node / "nodes.conf"),
                    "--save",
                    "",
                    "--appendonly",
                    "no",
                    "--dir",
                    str(node),
                    "--bind",
                    "127.0.0.1",
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        )
        wait_port(port)
    subprocess.run(
        [
            "redis-cli",
            "--cluster",
            "create",
            *(f"127.0.0.1:{p}" for p in ports),
            "--cluster-replicas",
            "0",
            "--cluster-yes",
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        info = subprocess.run(
            ["redis-cli", "-p", str(ports[0]), "cluster", "info"],
            capture_output=True,
            text=True,
            check=False,
        ).stdout
        if "cluster_state:ok" in info:
            break
        time.sleep(0.2)
    return f"redis+cluster://127.0.0.1:{ports[0]}"


TOPOLOGIES = {"tls": tls_url, "sentinel": sentinel_url, "cluster": cluster_url}


@pytest.mark.parametrize("topology", sorted(TOPOLOGIES))
async def test_store_decisions_over_topology(
    topology: str, procs: Processes, tmp_path: Path
) -> None:
    url = TOPOLOGIES[topology](procs, tmp_path)
    store = open_store(url, "topo")
    cfg = BreakerConfig()
    refs = [EntryRef(f"e{i}", f"pool{i}", Limits(sessions=1), MonthlyWindow()) for i in range(6)]
    try:
        for ref in refs:  # pools land on different cluster slots
            assert (await store.reserve(ref, cfg, "l1", NOW, 30)).granted
            assert (await store.settle(ref, cfg, "l1", NOW, outcome=Outcome.SUCCESS, ttl=9)).applied
            assert not (await store.reserve(ref, cfg, "l2", NOW, 30)).granted
            assert await store.release(ref, "l1", NOW + 3) == pytest.approx(3)
        snap = await store.snapshot(refs, NOW + 3)
        assert all(p.used["sessions"] == 1 for p in snap.pools.values())
    finally:
        await store.close()


def test_router_acquires_through_sentinel(procs: Processes, tmp_path: Path) -> None:
    url = sentinel_url(procs, tmp_path)
    config = {
        "state_url": url,
        "chain": [
            {
                "name": "local",
                "provider": "local",
                "quota": {"sessions": 1},
                "options": {"root": str(tmp_path / "sb")},
            }
        ],
    }
    with Router.from_config(config, hooks=[]) as router:
        with router.acquire() as lease:
            assert lease.sandbox.run("echo via-sentinel").stdout == "via-sentinel\n"
        assert router.status().entries[0].used["sessions"] == 1


@pytest.mark.parametrize("runner", ["resp", "redis-py"])
async def test_tls_refuses_a_certificate_for_another_host(
    procs: Processes, tmp_path: Path, runner: RunnerName
) -> None:
    ca = certificate(tmp_path, "test-ca", "DNS:ca.invalid")
    ref = EntryRef("e", "pool", Limits(sessions=1), MonthlyWindow())
    for name, san, trusted in (
        ("wrong", "DNS:wrong.example", False),
        ("right", "IP:127.0.0.1", True),
    ):
        key, cert = certificate(tmp_path, name, san, ca)
        port = tls_server(procs, key, cert, ca[1])
        url = f"rediss://127.0.0.1:{port}/0?ssl_ca_certs={ca[1]}&socket_connect_timeout=1"
        store = RedisStore(url, "tls", runner=runner)
        try:
            if trusted:
                assert (await store.reserve(ref, BreakerConfig(), "l1", NOW, 30)).granted
            else:
                with pytest.raises(StateUnavailable, match="certificate"):
                    await store.reserve(ref, BreakerConfig(), "l1", NOW, 30)
        finally:
            await store.close()


async def test_tenants_on_a_cluster_share_one_tag_and_span_pools_on_one_node(
    procs: Processes, tmp_path: Path
) -> None:
    """A tenant's lease counted with its pool in one script on a real 3-node Cluster:
    its limits hold across pools, a warm claim holds its cover against its usd, and
    its spend is listed. A store without tenants keeps each pool's own tag."""
    url = cluster_url(procs, tmp_path)
    plain, store = open_store(url, "plain"), open_store(url, "topo", tenants=True)
    cfg, meter = BreakerConfig(), Meter(0.01, 0.0, 0.0, 100.0, 50.0)
    limits = TenantLimits(sessions=None, usd=2.5, concurrent=2)
    t = TenantRef("user-42", limits, MonthlyWindow())
    refs = [
        EntryRef(f"e{i}", f"pool{i}", Limits(usd=10), MonthlyWindow(), tenant=t) for i in range(6)
    ]
    try:
        assert (await plain.reserve(replace(refs[0], tenant=None), cfg, "l0", NOW, 30)).granted
        assert await plain.client.exists("{plain:pool0}:held")  # the layout it always had
        for ref in refs[:2]:  # pools on different slots: one tag holds them and the tenant
            assert (await store.reserve(ref, cfg, f"l-{ref.pool}", NOW, 30, meter=meter)).granted
            assert await store.client.exists(f"{{topo:ledger}}:pool:{ref.pool}:held")
        denied = await store.reserve(refs[2], cfg, "l-pool2", NOW, 30, meter=meter)
        assert (denied.reason, denied.unit, denied.detail) == ("tenant", "concurrent", "user-42")
        await store.settle(refs[0], cfg, "l-pool0", NOW, outcome=Outcome.SUCCESS, ttl=60)
        assert await store.release(refs[0], "l-pool0", NOW + 10) == pytest.approx(10)
        # A warm sandbox of pool 3 claimed for the tenant: its $1.00 cover fits beside the
        # $0.10 spent and the $1.00 pool 1 holds; then the tenant has no room left.
        warm = replace(refs[3], tenant=None)
        assert (await store.reserve(warm, cfg, "w1", NOW, 30)).granted
        await store.settle(warm, cfg, "w1", NOW, outcome=Outcome.SUCCESS, ttl=130)
        assert await store.warm_put(warm, "w1", WarmRecord("sb", NOW, NOW + 100, NOW + 130), NOW)
        claimed = await store.reserve(refs[3], cfg, "l-3", NOW + 10, 30, warm=True, meter=meter)
        assert claimed.claimed is not None
        [usage] = await store.tenants(MonthlyWindow(), NOW + 10, 5)
        assert (usage.tenant, usage.sessions, usage.concurrent) == ("user-42", 2, 2)
        assert (usage.usd, usage.usd_held) == (pytest.approx(0.1), pytest.approx(2.0))
        full = await store.reserve(refs[4], cfg, "l-pool4", NOW + 10, 30, meter=meter)
        assert (full.reason, full.unit) == ("tenant", "concurrent")
        # Paused storage held against pool 5 and the tenant in one script: $0.30 fits the
        # $0.40 left, $0.50 does not; the settle charges the tenant too.
        hold = PausedHold("e5", NOW + 10, NOW + 40, 0.01)
        assert await store.hold_paused(refs[5], "sb5", hold, NOW + 10) is None
        too_much = PausedHold("e5", NOW + 10, NOW + 60, 0.01)
        assert (await store.hold_paused(refs[5], "sb6", too_much, NOW + 10)).limit == 2.5
        assert await store.settle_paused(refs[5], "sb5", NOW + 20) == pytest.approx(0.1)
        [usage] = await store.tenants(MonthlyWindow(), NOW + 20, 5)
        assert (usage.usd, usage.usd_held) == (pytest.approx(0.2), pytest.approx(2.0))
    finally:
        await plain.close()
        await store.close()


def test_a_router_counts_tenants_on_a_cluster(procs: Processes, tmp_path: Path) -> None:
    """Through a Router on a real Cluster: a tenant at its limit is refused while another
    is served; without a tenants: section a tenant is refused naming the config."""
    url = cluster_url(procs, tmp_path)
    chain = [
        {"name": f"local{i}", "provider": "local", "options": {"root": str(tmp_path / f"sb{i}")}}
        for i in range(2)
    ]  # fmt: skip
    config = {"state_url": url, "key_prefix": "tenants", "chain": chain}
    with Router.from_config(
        {**config, "tenants": {"default": {"sessions": 2}}}, hooks=[]
    ) as router:
        for _ in range(2):
            with router.acquire(tenant="user-42") as lease:
                assert lease.sandbox.run("echo on-cluster").stdout == "on-cluster\n"
        with pytest.raises(NoProviderAvailable, match="tenant 'user-42' limit reached"):
            router.acquire(tenant="user-42", timeout=2)
        router.acquire(tenant="user-7").release()
        assert {t.tenant: t.sessions for t in router.tenants()} == {"user-42": 2, "user-7": 1}
    with Router.from_config(config, hooks=[]) as bare:
        bare.acquire().release()
        with pytest.raises(ConfigError, match="tenant 'user-42': the state store is a Redis"):
            bare.acquire(tenant="user-42")


def test_turning_tenants_on_or_off_on_a_cluster_warns_of_the_counts_left_behind(
    procs: Processes, tmp_path: Path
) -> None:
    """The ledger's keys move when a Cluster's config turns tenants: on (one tag) or off
    (a tag per pool): the router's first acquire warns, naming the pool whose window
    was counted in the other layout and how to carry it over; a router whose layout
    holds the counts says nothing."""
    url = cluster_url(procs, tmp_path)
    entry = {"name": "local", "provider": "local", "options": {"root": str(tmp_path / "sb")}}
    config = {"state_url": url, "key_prefix": "moved", "chain": [entry]}
    tenants = {**config, "tenants": {}}

    def warned(cfg: dict[str, object]) -> list[str]:
        events: list[object] = []
        with Router.from_config(cfg, hooks=[events.append]) as router:
            router.acquire().release()
        return [e.problem for e in events if isinstance(e, StateWarning) and "Cluster" in e.problem]

    assert warned(config) == []
    [problem] = warned(tenants)
    assert "pool(s) 'local' are under the hash tag {moved:<pool>}" in problem
    assert "counts under {moved:ledger} (the config's tenants: section was turned on)" in problem
    assert "sandbox-router quota set POOL UNIT VALUE" in problem
    assert warned(tenants) != []  # both layouts hold counts now: it keeps saying so
    assert "turned off" in warned(config)[0]
