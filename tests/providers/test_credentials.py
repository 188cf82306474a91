"""Every cloud adapter finds its credentials the same way (`providers.base.credential`).

The entry's option wins when set, even empty (an entry that names its key
never borrows another account's key from the environment); else the vendor's
environment variable; the reason an entry is unconfigured names what to set;
no repr shows a secret. Nor does an adapter touch the process environment
(which the app's own SDK calls read too).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
from pydantic import SecretStr

from emulators import available
from providers import provider_class

# kind -> {option name: environment variable}
CREDENTIALS = {
    "daytona": {"api_key": "DAYTONA_API_KEY"},
    "runloop": {"api_key": "RUNLOOP_API_KEY"},
    "e2b": {"api_key": "E2B_API_KEY"},
    "modal": {"token_id": "MODAL_TOKEN_ID", "token_secret": "MODAL_TOKEN_SECRET"},
}
KINDS = available(list(CREDENTIALS))


@pytest.fixture(params=KINDS)
def kind(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    for env in CREDENTIALS[request.param].values():
        monkeypatch.delenv(env, raising=False)
    return str(request.param)


def make(kind: str, **secrets: str) -> object:
    cls = provider_class(kind)
    options = cls.Options(**{k: SecretStr(v) for k, v in secrets.items()})
    return cls(f"{kind}-entry", options)


def test_unconfigured_says_what_to_set(kind: str) -> None:
    provider = provider_class(kind)(f"{kind}-entry")
    assert not provider.configured()
    reason = str(provider.unconfigured_reason())
    for option, env in CREDENTIALS[kind].items():
        assert env in reason
        assert option in reason


def test_the_environment_configures_an_entry(kind: str, monkeypatch) -> None:
    provider = provider_class(kind)(f"{kind}-entry")
    for env in CREDENTIALS[kind].values():
        assert not provider.configured()
        monkeypatch.setenv(env, f"from-env-{env}")
    assert provider.configured()


def test_options_configure_an_entry_and_stay_out_of_reprs(kind: str) -> None:
    secrets = {option: f"hidden-{option}-value" for option in CREDENTIALS[kind]}
    provider = make(kind, **secrets)
    assert provider.configured()  # type: ignore[attr-defined]
    shown = repr(provider) + repr(provider.options) + str(provider.options)  # type: ignore[attr-defined]
    assert not [v for v in secrets.values() if v in shown]


def test_an_empty_option_does_not_fall_back_to_the_environment(kind: str, monkeypatch) -> None:
    for env in CREDENTIALS[kind].values():
        monkeypatch.setenv(env, f"from-env-{env}")
    provider = make(kind, **dict.fromkeys(CREDENTIALS[kind], ""))
    assert not provider.configured()  # type: ignore[attr-defined]


# kind -> options pointing the adapter at a dead loopback endpoint ({url})
DEAD_ENDPOINT = {
    "daytona": {"api_key": "k", "api_url": "{url}/api"},
    "runloop": {"api_key": "k", "base_url": "{url}"},
    "e2b": {"api_key": "k", "api_url": "{url}", "sandbox_url": "{url}"},
    "modal": {"token_id": "ak-x", "token_secret": "as-x", "server_url": "{url}"},
}


@pytest.mark.parametrize("kind", KINDS)
def test_using_an_adapter_leaves_the_environment_untouched(kind: str) -> None:
    script = textwrap.dedent(
        f"""
        import asyncio, os
        from emulators.harness import free_port
        from providers import provider_class
        from providers.base import SandboxSpec
        from providers.errors import ProviderError
        before = dict(os.environ)
        url = f"http://127.0.0.1:{{free_port()}}"
        cls = provider_class({kind!r})
        options = {{k: v.format(url=url) for k, v in {DEAD_ENDPOINT[kind]!r}.items()}}
        # the create waits for the vendor's own request timeout (a late answer is counted)
        provider = cls("dead", cls.Options(**options, request_timeout=3))
        async def use():
            try:
                await provider.create(SandboxSpec(), timeout=2)
            except ProviderError:
                pass
            await provider.aclose()
        asyncio.run(use())
        changed = sorted(k for k in before.keys() | os.environ.keys()
                         if before.get(k) != os.environ.get(k))
        print(changed, flush=True)
        # E2B's pyqwest transport (a process-global Rust runtime) aborts the
        # interpreter's shutdown now and then after a create against a dead endpoint
        # was cut off (SIGABRT, no Python frame: the SDK's, not measured here).
        os._exit(0)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.strip() == "[]", done.stdout + done.stderr
