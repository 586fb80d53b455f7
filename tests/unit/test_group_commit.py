"""Group commit of the async sender: concurrent sends share transactions, all or nothing."""

from __future__ import annotations

import asyncio

import pytest

from condmsg.sending.group_commit import MAX_BATCH_CMS, GroupCommit
from condmsg.sending.send_rows import SendRows
from tests.async_helpers import run_async


def rows(cm_id: str) -> SendRows:
    return SendRows(cms=[{"cm_id": cm_id}], copies=[{"cm_id": cm_id, "destination": "q"}])


def test_concurrent_sends_share_transactions_and_each_returns_once_written() -> None:
    written: list[list[str]] = []
    in_flight = 0
    most_in_flight = 0

    async def write(batch: SendRows) -> None:
        nonlocal in_flight, most_in_flight
        in_flight += 1
        most_in_flight = max(most_in_flight, in_flight)
        await asyncio.sleep(0.01)  # a transaction's round trips
        written.append(batch.cm_ids())
        assert [c["cm_id"] for c in batch.copies] == batch.cm_ids()
        in_flight -= 1

    async def main() -> None:
        group = GroupCommit(write, writers=2)
        await group.add(rows("alone"))  # a lone send is written at once, by itself
        sends = []
        for i in range(3 * MAX_BATCH_CMS):
            sends.append(asyncio.ensure_future(group.add(rows(f"cm-{i}"))))
            if i % 50 == 49:
                # Many requests arrive, not one step that starts them all: creating hundreds
                # of tasks at once in debug mode holds the loop by itself.
                await asyncio.sleep(0)
        await asyncio.gather(*sends)

    run_async(main())
    assert written[0] == ["alone"]
    rest = written[1:]
    assert sorted(cm for batch in rest for cm in batch) == sorted(
        f"cm-{i}" for i in range(3 * MAX_BATCH_CMS)
    )
    assert len(rest) < 3 * MAX_BATCH_CMS / 10 and max(map(len, rest)) == MAX_BATCH_CMS
    assert most_in_flight == 2


def test_a_failed_transaction_fails_every_send_of_its_batch_and_not_the_next() -> None:
    calls = 0

    async def write(batch: SendRows) -> None:
        nonlocal calls
        calls += 1
        await asyncio.sleep(0.01)
        if "bad" in batch.cm_ids():
            raise ConnectionError("the store went away")

    async def main() -> list[BaseException | None]:
        group = GroupCommit(write, writers=1)
        first = asyncio.ensure_future(group.add(rows("first")))
        await asyncio.sleep(0)  # in flight: the next two wait and share a batch
        same = [group.add(rows("bad")), group.add(rows("innocent"))]
        results = await asyncio.gather(first, *same, return_exceptions=True)
        await group.add(rows("later"))
        return results

    first, bad, innocent = run_async(main())
    assert first is None
    assert isinstance(bad, ConnectionError) and isinstance(innocent, ConnectionError)
    assert calls == 3


def test_exceptions_are_raised_to_the_caller() -> None:
    async def write(batch: SendRows) -> None:
        raise ValueError("refused")

    with pytest.raises(ValueError, match="refused"):
        run_async(GroupCommit(write).add(rows("x")))
