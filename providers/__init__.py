"""Provider adapters: one per vendor SDK, plus ``local``.

`provider_class` maps a provider kind (the ``provider:`` field of a chain
entry) to its adapter, importing the module only when used so an
installation without, say, the ``modal`` extra never imports modal.
"""

from __future__ import annotations

import importlib
import importlib.util

from providers.base import Provider

__all__ = ["PROVIDERS", "SDKS", "missing_sdk", "provider_class"]

PROVIDERS: dict[str, str] = {
    "local": "providers.local:LocalProvider",
    "daytona": "providers.daytona:DaytonaProvider",
    "runloop": "providers.runloop:RunloopProvider",
    "modal": "providers.modal:ModalProvider",
    "e2b": "providers.e2b:E2BProvider",
}


# The vendor SDK each adapter needs, and the extra that installs it.
SDKS: dict[str, tuple[str, str]] = {
    "daytona": ("daytona", "daytona"),
    "runloop": ("runloop_api_client", "runloop"),
    "modal": ("modal", "modal"),
    "e2b": ("e2b_code_interpreter", "e2b"),
}


def missing_sdk(kind: str) -> str | None:
    """Why an entry of ``kind`` cannot run here (its SDK is not installed), or None."""
    if kind not in SDKS:
        return None
    module, extra = SDKS[kind]
    if importlib.util.find_spec(module) is None:
        return f"the {module} SDK is not installed (pip install 'sandbox-router[{extra}]')"
    return None


def provider_class(kind: str) -> type[Provider]:
    """The adapter class of provider ``kind``; ValueError for an unknown kind."""
    try:
        target = PROVIDERS[kind]
    except KeyError:
        raise ValueError(
            f"unknown provider {kind!r}; expected one of {sorted(PROVIDERS)}"
        ) from None
    module, _, attr = target.partition(":")
    cls: type[Provider] = getattr(importlib.import_module(module), attr)
    return cls
