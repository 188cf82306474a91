"""Local servers speaking each provider's real wire protocol.

The unmodified vendor SDKs run against them, so contract tests, benchmarks,
``sandbox-router demo`` and users' own CI can exercise failover without a
cloud account. `emulator_class` finds one by provider name; the shared parts
(faults, quotas, records, the background thread) are in `emulators.harness`.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from emulators.harness import Emulator

__all__ = ["EMULATORS", "available", "emulator_class", "sdk_environment"]

EMULATORS: dict[str, str] = {
    "daytona": "emulators.daytona:DaytonaEmulator",
    "runloop": "emulators.runloop:RunloopEmulator",
    "modal": "emulators.modal:ModalEmulator",
    "e2b": "emulators.e2b:E2BEmulator",
}


def emulator_class(name: str) -> type[Emulator]:
    """The emulator class for provider ``name`` (imported on first use)."""
    try:
        target = EMULATORS[name]
    except KeyError:
        raise ValueError(f"no emulator for {name!r}; expected one of {sorted(EMULATORS)}") from None
    module, _, attr = target.partition(":")
    cls: type[Emulator] = getattr(importlib.import_module(module), attr)
    return cls


def available(names: list[str] | None = None) -> list[str]:
    """The providers (of ``names``, default all) whose emulator and adapter both import."""
    from providers import provider_class

    found = []
    for name in names if names is not None else list(EMULATORS):
        try:
            emulator_class(name)
            provider_class(name)
        except (ImportError, AttributeError, ValueError):
            continue
        found.append(name)
    return found


class PointsSdks(Protocol):
    """An emulator, here or in another process: what its SDK's environment is."""

    def sdk_env(self) -> dict[str, str]: ...


@contextmanager
def sdk_environment(*emulators: PointsSdks) -> Iterator[None]:
    """Point the SDKs' (and the adapters') environment variables at ``emulators``,
    and put the environment back as it was afterwards."""
    values = {k: v for emu in emulators for k, v in emu.sdk_env().items()}
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, old in saved.items():
            if old is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = old
