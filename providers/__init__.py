"""Provider adapters: one per vendor SDK, plus ``local``.

`provider_class` maps a provider kind (the ``provider:`` field of a chain
entry) to its adapter, importing the module only when used so an
installation without, say, the ``modal`` extra never imports modal.
"""

from __future__ import annotations

import importlib

from providers.base import Provider

__all__ = ["PROVIDERS", "provider_class"]

PROVIDERS: dict[str, str] = {
    "local": "providers.local:LocalProvider",
    "daytona": "providers.daytona:DaytonaProvider",
    "runloop": "providers.runloop:RunloopProvider",
    "modal": "providers.modal:ModalProvider",
    "e2b": "providers.e2b:E2BProvider",
}


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
