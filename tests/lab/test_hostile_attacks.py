"""The hostile probe's attack drivers, against an HTTP stand-in for the server
(``httpx.MockTransport``: every request answered 200), so their timing is checked without one."""

from __future__ import annotations

import asyncio
import random
import time
from types import SimpleNamespace

import httpx

from continuum_lab.cli.reliability.hostile_attacks import atk_ending_others


def test_ending_others_acts_for_its_whole_window_even_when_honest_programs_start_late():
    """On a loaded server the honest agents' first turns take longer than the attack's window: the
    attacker waits for a target, then acts for the window it was given (it once found its window
    spent by the wait and sent nothing)."""

    async def run() -> dict:
        honest = SimpleNamespace(live={}, ended=[], tag="t")
        transport = httpx.MockTransport(lambda request: httpx.Response(200, json={"text": "", "meta_info": {}}))
        async with httpx.AsyncClient(transport=transport) as client:
            attack = SimpleNamespace(
                s=SimpleNamespace(hostile_endings=12),
                honest=honest,
                rng=random.Random(1),
                url="http://server",
                client=client,
                deadline=time.monotonic() + 0.6,
                ids=lambda n: [1] * n,
            )

            async def honest_start() -> None:
                await asyncio.sleep(0.8)  # past the attack's deadline
                honest.live["honest-1"] = 1

            started = asyncio.ensure_future(honest_start())
            result = await atk_ending_others(attack)
            await started
            return result

    result = asyncio.run(run())
    assert result["sent"] >= 3 and result["honest_programs_targeted"] == 1, result
