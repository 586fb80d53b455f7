"""The stall check that async tests run under (tests/async_helpers.py)."""

from __future__ import annotations

import asyncio
import time

import pytest

from tests.async_helpers import LoopStalled, run_async


async def _blocks(seconds: float) -> str:
    await asyncio.sleep(0)
    time.sleep(seconds)  # the blocking call the check exists to catch
    return "done"


def test_a_loop_never_held_returns_the_result() -> None:
    assert run_async(asyncio.sleep(0.01, result="ok")) == "ok"


def test_a_callback_that_holds_the_loop_fails_the_run() -> None:
    with pytest.raises(
        LoopStalled, match=r"held longer than 50 ms 1 time\(s\): <Task .* took 1[0-9]{2} ms"
    ):
        run_async(_blocks(0.12))


def test_ignored_stalls_pass_and_exceptions_from_main_come_through() -> None:
    assert run_async(_blocks(0.12), ignore=lambda stall: stall.took_s >= 0.1) == "done"

    async def fails() -> None:
        raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        run_async(fails())
