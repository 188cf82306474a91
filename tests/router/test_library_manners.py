"""A library does not configure logging: its lines go where the app's own setup sends them."""

from __future__ import annotations

import gc
import logging

import pytest
import structlog

from router.testing import ScriptedProvider


def test_a_router_leaves_logging_to_the_app(
    new_router, redis_url, key_prefix, tmp_path, capfd, caplog
) -> None:
    caplog.set_level(logging.INFO, "sandbox_router")
    router = new_router(
        {
            "state_url": redis_url,
            "key_prefix": key_prefix,
            "log": {"format": "json", "level": "debug"},
            "chain": [{"name": "only", "provider": "local"}],
        },
        providers={"only": ScriptedProvider("only", tmp_path)},
    )
    router.acquire().release()
    router.status()
    assert not structlog.is_configured()
    out, err = capfd.readouterr()
    assert (out, err) == ("", "")  # nothing printed behind the app's back
    lines = [r.getMessage() for r in caplog.records if r.name == "sandbox_router"]
    assert any(line.startswith("sandbox_router.acquired entry='only'") for line in lines)


def test_the_apps_structlog_setup_gets_the_lines(new_router, redis_url, key_prefix, tmp_path):
    seen: list[dict[str, object]] = []

    def keep(_logger: object, _method: str, event_dict: dict[str, object]) -> str:
        seen.append(dict(event_dict))
        return ""

    structlog.configure(processors=[keep], logger_factory=structlog.ReturnLoggerFactory())
    router = new_router(
        {"state_url": redis_url, "key_prefix": key_prefix,
         "chain": [{"name": "only", "provider": "local"}]},
        providers={"only": ScriptedProvider("only", tmp_path)},
    )  # fmt: skip
    router.acquire().release()
    assert "sandbox_router.acquired" in [e["event"] for e in seen]


@pytest.fixture(autouse=True)
def _reset_structlog() -> None:
    yield
    structlog.reset_defaults()


def test_a_scripted_provider_never_closed_leaves_no_directory_behind() -> None:
    """`ScriptedProvider` without a ``root`` makes a temporary one; dropping the
    provider unclosed (reading its capabilities, say) must not leave it in /tmp."""
    provider = ScriptedProvider("x")
    root = provider.local.root.parent
    assert root.is_dir()
    del provider
    gc.collect()
    assert not root.exists()
