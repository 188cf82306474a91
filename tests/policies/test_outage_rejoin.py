"""When a replica back from an outage may use the shared ledger again (`rejoin`)."""

from __future__ import annotations

import pytest

from policies.outage import REJOIN_WAIT, rejoin

BACK, BEAT = 100.0, 0.5


@pytest.mark.parametrize(
    ("fresh", "fleet", "waited", "expected"),
    [
        (0, 1, 0.0, False),  # not even itself has registered since its return
        (1, 1, 0.0, True),
        (7, 8, 0.0, False),  # one of the fleet has not handed over yet
        (8, 8, 0.0, True),
        (9, 8, 0.0, True),  # a replica that joined meanwhile owes nothing either
        (7, 8, REJOIN_WAIT * BEAT - 0.01, False),
        (7, 8, REJOIN_WAIT * BEAT, True),  # the missing one died in the outage
    ],
)
def test_rejoin(fresh: int, fleet: int, waited: float, expected: bool) -> None:
    assert rejoin(fresh, fleet, BACK, BACK + waited, BEAT) is expected
