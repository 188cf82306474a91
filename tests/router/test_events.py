"""Events are typed records: each has its own log name, and the hooks take every one."""

from __future__ import annotations

import dataclasses
import typing

import pytest
from prometheus_client import CollectorRegistry

from router.events import RouterEvent, log_hook
from router.metrics import RouterMetrics

EVENTS = typing.get_args(RouterEvent)


def sample(cls: type[RouterEvent]) -> RouterEvent:
    """An instance with plausible values for every field."""
    values = {"reasons": {"a": "b"}, "seconds": 1.0, "cost": 0.01, "value": 1.0, "resumed": False}
    kinds = {int: 1, float: 0.5, str: "x"}
    hints = typing.get_type_hints(cls)
    args = {
        f.name: values.get(f.name, kinds.get(hints[f.name], "x")) for f in dataclasses.fields(cls)
    }
    return cls(**args)


def test_every_event_has_its_own_name() -> None:
    names = [cls.name for cls in EVENTS]
    assert len(set(names)) == len(names)


@pytest.mark.parametrize("cls", EVENTS, ids=lambda c: c.name)
def test_the_hooks_take_every_event(cls: type[RouterEvent]) -> None:
    event = sample(cls)
    assert event.fields == dataclasses.asdict(event)
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(event, dataclasses.fields(event)[0].name, "other")
    log_hook(event)
    RouterMetrics(CollectorRegistry()).hook(event)
