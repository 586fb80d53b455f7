"""The relay's claim schedule on a settable clock: when it claims, from which id, and when it
has proved that nothing is left (no database, no broker)."""

from __future__ import annotations

import ast
from pathlib import Path

from condmsg.infra.backoff import Backoff
from outbox import claim_schedule
from outbox.claim_schedule import ClaimSchedule, PlannedClaim

BATCH = 10
POLL_S = 1.0
RESCAN_S = 5.0


class Clock:
    """A monotonic clock that moves only when told."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _schedule(clock: Clock, *, locking: bool = True) -> ClaimSchedule:
    return ClaimSchedule(
        batch_size=BATCH,
        poll_interval_s=POLL_S,
        rescan_interval_s=RESCAN_S,
        locking=locking,
        clock=clock,
        backoff=Backoff(0.2, 10.0),
    )


def _claim(schedule: ClaimSchedule, in_flight: int = 0) -> PlannedClaim:
    planned = schedule.next_claim(in_flight)
    assert planned is not None, "a claim was due"
    return planned


def _took(schedule: ClaimSchedule, planned: PlannedClaim, rows: int, in_flight: int = 0) -> bool:
    return schedule.claimed(
        planned, rows=rows, last_id=planned.after_id + rows, in_flight=in_flight
    )


def test_a_backlog_is_claimed_behind_the_previous_batch_until_a_batch_comes_back_short() -> None:
    clock = Clock()
    schedule = _schedule(clock)
    first = _claim(schedule)
    assert first.from_head
    _took(schedule, first, BATCH)
    second = _claim(schedule, in_flight=1)
    assert second.after_id == BATCH
    _took(schedule, second, 3, in_flight=1)
    # A short batch: caught up, so the next claim (a wake-up asks for it) starts at the head.
    schedule.wake()
    assert _claim(schedule, in_flight=2).from_head


def test_with_nothing_claimable_only_a_wake_up_or_the_poll_interval_makes_a_claim() -> None:
    clock = Clock()
    schedule = _schedule(clock)
    assert _took(schedule, _claim(schedule), 0)
    assert schedule.next_claim(0) is None
    assert schedule.until_poll_s() == POLL_S
    schedule.wake()
    _took(schedule, _claim(schedule), 0)
    assert schedule.next_claim(0) is None
    clock.now += POLL_S
    assert schedule.until_poll_s() == 0.0
    assert _claim(schedule).from_head


def test_a_wake_up_during_a_claim_is_not_lost() -> None:
    clock = Clock()
    schedule = _schedule(clock)
    planned = _claim(schedule)
    schedule.wake()  # a NOTIFY for a row the claim did not see
    _took(schedule, planned, 0)
    assert schedule.next_claim(0) is not None


def test_idleness_is_proved_by_an_empty_claim_from_the_head_taken_after_the_request() -> None:
    clock = Clock()
    schedule = _schedule(clock)
    earlier = _claim(schedule)
    ticket = schedule.want_idle()
    _took(schedule, earlier, 0)  # planned before the request: proves nothing to it
    assert not schedule.idle_since(ticket)
    proof = _claim(schedule)
    assert proof.from_head
    assert _took(schedule, proof, 0)
    assert schedule.idle_since(ticket)


def test_rows_in_flight_or_rows_found_prove_no_idleness() -> None:
    clock = Clock()
    schedule = _schedule(clock)
    ticket = schedule.want_idle()
    assert not _took(schedule, _claim(schedule), 0, in_flight=1)
    assert not _took(schedule, _claim(schedule), 2)
    assert not schedule.idle_since(ticket)
    # Nothing claimable and nothing in flight: the waiter's claim is made without a wake-up.
    assert _took(schedule, _claim(schedule), 0)
    assert schedule.idle_since(ticket)


def test_an_empty_claim_behind_the_cursor_sends_the_next_one_to_the_head() -> None:
    clock = Clock()
    schedule = _schedule(clock)
    _took(schedule, _claim(schedule), BATCH)
    behind = _claim(schedule, in_flight=1)
    assert behind.after_id == BATCH
    ticket = schedule.want_idle()
    assert not _took(schedule, behind, 0)
    proof = _claim(schedule)
    assert proof.from_head
    assert _took(schedule, proof, 0)
    assert schedule.idle_since(ticket)


def test_a_long_drain_rescans_from_the_head_every_rescan_interval() -> None:
    clock = Clock()
    schedule = _schedule(clock)
    _took(schedule, _claim(schedule), BATCH)
    clock.now += RESCAN_S - 0.5
    planned = _claim(schedule, in_flight=1)
    assert planned.after_id == BATCH
    _took(schedule, planned, BATCH, in_flight=1)
    clock.now += 0.5
    assert _claim(schedule, in_flight=2).from_head


def test_without_row_locks_a_rescan_waits_until_nothing_is_in_flight() -> None:
    clock = Clock()
    schedule = _schedule(clock, locking=False)
    _took(schedule, _claim(schedule), BATCH)
    clock.now += RESCAN_S
    assert _claim(schedule, in_flight=1).after_id == BATCH
    assert _claim(schedule, in_flight=0).from_head


def test_batches_given_back_restart_the_claims_from_the_head() -> None:
    clock = Clock()
    schedule = _schedule(clock)
    _took(schedule, _claim(schedule), BATCH)
    _took(schedule, _claim(schedule, in_flight=1), 3, in_flight=1)
    assert schedule.next_claim(2) is None  # caught up: nothing due until a wake-up or poll
    schedule.restart()  # the broker failed: both batches came back
    assert _claim(schedule).from_head


def test_a_failed_settle_sends_the_next_claim_to_the_head() -> None:
    clock = Clock()
    schedule = _schedule(clock)
    _took(schedule, _claim(schedule), BATCH)
    schedule.rescan()
    assert _claim(schedule, in_flight=1).from_head


def test_after_a_failed_claim_the_next_waits_for_the_backoff() -> None:
    clock = Clock()
    schedule = _schedule(clock)
    failed = _claim(schedule)
    schedule.claim_failed(failed)
    assert schedule.next_claim(0) is None
    clock.now += 0.125  # the first delay is 0.2 s, shortened by up to a quarter
    assert schedule.next_claim(0) is None
    clock.now += 0.125
    retried = _claim(schedule)
    assert retried.from_head
    _took(schedule, retried, BATCH)
    assert _claim(schedule, in_flight=1).after_id == BATCH


def test_the_schedule_does_no_io_and_reads_only_the_clock_it_is_given() -> None:
    tree = ast.parse(Path(claim_schedule.__file__).read_text())
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            imported.add(node.module)
    # The backoff is the one thing of ours it uses: a delay, computed.
    assert imported <= {"__future__", "collections.abc", "dataclasses", "condmsg.infra.backoff"}
    clocks = [
        n.lineno
        for n in ast.walk(tree)
        if isinstance(n, ast.Attribute) and n.attr in {"monotonic", "time", "now", "sleep"}
    ]
    assert clocks == []
