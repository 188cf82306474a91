"""`LoopBound`: one SDK client per event loop, closed only on its own loop."""

from __future__ import annotations

import asyncio

from providers.base import LoopBound


class Client:
    opened = 0

    def __init__(self) -> None:
        Client.opened += 1
        self.loop = asyncio.get_running_loop()


def test_one_client_per_loop_and_taken_only_on_its_loop() -> None:
    bound: LoopBound[Client] = LoopBound()

    async def twice() -> Client:
        first = bound.get(Client)
        assert bound.get(Client) is first
        return first

    first = asyncio.run(twice())
    second = asyncio.run(twice())  # a new loop: the old client's connections are unusable
    assert second is not first
    assert second.loop is not first.loop

    async def take() -> Client | None:
        return bound.take()

    assert asyncio.run(take()) is None  # not this loop's client: nothing to close here
    assert asyncio.run(take()) is None  # and it is forgotten

    async def own() -> tuple[Client, Client | None]:
        client = bound.get(Client)
        return client, bound.take()

    client, taken = asyncio.run(own())
    assert taken is client
    assert Client.opened == 3
