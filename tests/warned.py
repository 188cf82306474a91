"""Expecting one warning without tripping on another thread's or the collector's.

``pytest.warns`` re-emits every warning it caught but did not match, and the suite turns
warnings into errors: a transport some earlier test left for the garbage collector, reclaimed
inside the block, would fail the test that happened to be running.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def warns(category: type[Warning], match: str) -> Iterator[None]:
    """Assert the block warns ``category`` with a message matching ``match``; drop the rest."""
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        yield
    messages = [str(w.message) for w in seen if issubclass(w.category, category)]
    assert any(re.search(match, m) for m in messages), (
        f"no {category.__name__} matching {match!r}; got {messages}"
    )
