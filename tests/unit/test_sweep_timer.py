"""When the deadline sweeps run: at the earliest next check, within the interval."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime, timedelta

from evaluator.sweep_timer import MIN_GAP_S, SweepTimer

T0 = datetime(2026, 1, 1, 12, tzinfo=UTC)


def _timer(interval_s: float = 1.0) -> SweepTimer:
    return SweepTimer(lambda: None, interval_s=interval_s, clock=lambda: T0, name="test-sweep")


def test_the_next_sweep_comes_when_the_earliest_cm_is_due() -> None:
    assert _timer().delay_s(T0 + timedelta(milliseconds=300)) == 0.3


def test_the_interval_bounds_the_wait_with_nothing_scheduled_or_far_ahead() -> None:
    assert _timer().delay_s(None) == 1.0
    assert _timer().delay_s(T0 + timedelta(hours=1)) == 1.0


def test_cms_already_due_wait_for_the_least_gap_between_sweep_starts() -> None:
    assert _timer().delay_s(T0 - timedelta(seconds=5)) == MIN_GAP_S
    assert _timer().delay_s(T0, took_s=MIN_GAP_S / 2) == MIN_GAP_S / 2
    assert _timer().delay_s(T0, took_s=1.0) == 0.0


def test_a_short_interval_wins_over_the_least_gap() -> None:
    assert _timer(interval_s=MIN_GAP_S / 4).delay_s(T0) == MIN_GAP_S / 4


def test_a_running_timer_sweeps_again_at_the_instant_the_sweep_named() -> None:
    swept: list[float] = []
    done = threading.Event()

    def sweep() -> datetime | None:
        swept.append(time.monotonic())
        if len(swept) >= 2:
            done.set()
            return None
        return datetime.now(UTC) + timedelta(milliseconds=100)

    timer = SweepTimer(sweep, interval_s=0.05, clock=lambda: datetime.now(UTC), name="test-sweep")
    timer.start()
    try:
        assert done.wait(10)
    finally:
        timer.stop()
    assert not timer.running
    # Sooner than never: the interval (50 ms) bounds the wait, on a loaded machine too.
    assert swept[1] - swept[0] < 5.0
