"""The soak's bookkeeping, without a pipeline: which window is the reference, how the goals
judge the windows, how outcomes that overtake their send are counted, and that a plain
``python -m bench`` leaves the hour-long soak out."""

from __future__ import annotations

from bench import __main__ as runner
from bench._stack import Tracker
from bench.soak import Window, goals, reference_index


def test_the_reference_is_ten_minutes_in_or_a_third_of_a_shorter_run() -> None:
    assert reference_index(60, 5) == 1  # the window ending at 10 minutes
    assert reference_index(2, 0.5) == 1  # a third of 2 minutes falls in the second window
    assert reference_index(3, 0.5) == 1
    assert reference_index(90, 10) == 0


def _window(index: int, p99_ms: float, rss: float, outbox_kb: int) -> Window:
    window = Window(index, latencies_ms=[p99_ms] * 10)
    window.rss_mb = {"relay": rss, "rabbitmq": 500.0 * (index + 1)}
    window.outbox_peak_kb = {"sender.condmsg_outbox": outbox_kb}
    return window


def test_goals_hold_for_a_flat_run_and_fail_on_growth() -> None:
    flat = [_window(i, 20.0, 70.0, 1000) for i in range(4)]
    assert all(r.ok for r in goals(flat, 1))

    grown = [*flat[:3], _window(3, 40.0, 90.0, 3000)]
    judged = {r.figure: r.ok for r in goals(grown, 1)}
    assert judged == {
        "soak p99 send→outcome, last window / second": False,
        "soak RSS of relay, last window (MB)": False,
        "soak sender.condmsg_outbox peak size, last window (kB)": False,
    }


def test_the_shared_brokers_memory_is_not_a_goal() -> None:
    windows = [_window(i, 20.0, 70.0, 1000) for i in range(3)]
    assert not any("rabbitmq" in r.figure for r in goals(windows, 1))


def test_an_outcome_read_before_its_send_returned_is_counted_once() -> None:
    seen: list[float] = []
    tracker = Tracker(lambda _sent, ms: seen.append(ms))
    tracker.mark_arrived("early", "satisfied")
    tracker.mark_sent(["early", "later"])
    tracker.mark_arrived("later", "violated")
    tracker.wait_done(2, 1)
    assert len(seen) == 2 and tracker.sent == {} and tracker.early == {}
    assert tracker.verdicts == {"satisfied": 1, "violated": 1}


def test_a_plain_bench_run_leaves_the_soak_out_and_runs_it_when_named() -> None:
    everything = runner.chosen([])
    assert "soak" not in everything
    assert {"pipeline", "store_size", "scale_out"} <= set(everything)
    assert runner.chosen(["soak"]) == ["soak"]
