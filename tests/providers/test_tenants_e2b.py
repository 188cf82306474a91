"""Tenant limits through the real E2B adapter on its emulator, over real Redis: a tenant
at its limit is refused while another is served, and its spend is settled."""

from __future__ import annotations

import pytest

from emulators import available
from emulators.e2b import TEST_API_KEY
from emulators.harness import Emulator
from providers.base import SandboxSpec
from providers.errors import NoProviderAvailable
from router import Router
from tests.polling import wait_until
from tests.providers.test_failover import RouterFactory

pytestmark = pytest.mark.skipif("e2b" not in available(["e2b"]), reason="needs the e2b SDK")


def test_a_tenant_at_its_limit_on_e2b_is_refused_while_another_is_served(
    e2b_emulator: Emulator, redis_url: str, key_prefix: str, new_router: RouterFactory
) -> None:
    router: Router = new_router(
        {
            "state_url": redis_url,
            "key_prefix": key_prefix,
            "create_timeout": 5,
            "acquire_timeout": 10,
            "tenants": {"default": {"concurrent": 1, "usd": 1.0}},
            "chain": [
                {"name": "e2b", "provider": "e2b",
                 "price": {"vcpu_hour": 0, "memory_gib_hour": 0, "per_sandbox": 0.25},
                 "options": {"api_key": TEST_API_KEY, "api_url": e2b_emulator.url,
                             "sandbox_url": e2b_emulator.url}},
            ],
        },
        hooks=[],
    )  # fmt: skip
    spec = SandboxSpec(lifetime=60)
    with router.acquire(spec, tenant="user-42") as lease:
        assert lease.sandbox.run("echo hi").stdout == "hi\n"
        with pytest.raises(NoProviderAvailable, match="tenant 'user-42' limit reached"):
            router.acquire(spec, tenant="user-42", timeout=3)
        with router.acquire(spec, tenant="user-7") as other:  # the pool still serves
            assert other.sandbox.run("echo there").stdout == "there\n"
    wait_until(lambda: e2b_emulator.alive() == [])
    for _ in range(3):  # $0.25 a sandbox: 4 in all fit the dollar
        router.acquire(spec, tenant="user-42").release()
    with pytest.raises(NoProviderAvailable, match=r"tenant 'user-42' usd limit: \$1.0000"):
        router.acquire(spec, tenant="user-42", timeout=3)
    spent = {t.tenant: t for t in router.tenants()}
    assert (spent["user-42"].sessions, spent["user-42"].usd) == (4, pytest.approx(1.0))
    assert (spent["user-7"].sessions, spent["user-7"].usd) == (1, pytest.approx(0.25))
    wait_until(lambda: e2b_emulator.alive() == [])
