"""Acks the evaluator doubts: acks with implausible times (outside the clock-skew
tolerance) do not count; late acks are judged together, and two late COMMIT acks that
satisfy a minimum between them contradict the decision (status, anomaly, metric,
``condmsg status``), while a late ack that changes nothing is not flagged."""

from __future__ import annotations

import contextlib
import io
from collections import Counter
from datetime import timedelta
from typing import Any

import pytest

from condmsg import Destination, DestinationSet, tables
from condmsg.cli import main as cli
from condmsg.core.acks import AckKind
from tests.integration.evaluator import test_evaluator_intake as intake_tests
from tests.integration.evaluator.test_evaluator_intake import Store, ack

pytestmark = [pytest.mark.postgres]


# The intake tests' stores (a sender, its engine and a settable clock).
make_store = intake_tests.make_store
store = intake_tests.store


def _anomalies(s: Store) -> Counter[str]:
    return Counter(r.kind for r in s.rows(tables.anomalies))


@pytest.mark.parametrize(
    ("read_ms", "commit_ms", "counts"),
    [
        (-3_600_000, None, False),  # read an hour before the CM was sent
        (-500, None, True),  # within the tolerance (1 s)
        (5_000, None, False),  # read 4 s after the evaluator received it
        (0, 4_000, False),  # committed 3 s after it was received
        (0, 1_900, True),  # committed 0.9 s after: within the tolerance
    ],
)
def test_acks_with_implausible_times_do_not_count(
    store: Store, read_ms: int, commit_ms: int | None, counts: bool
) -> None:
    s = store
    q = s.queue
    sent = s.clock.at
    cm = s.sender.send(b"x", Destination(q, pickup_within=timedelta(seconds=10)))
    s.clock.at = sent + timedelta(seconds=1)  # the ack's receipt
    read = sent + timedelta(milliseconds=read_ms)
    extra: dict[str, Any] = {}
    if commit_ms is not None:
        extra = {"kind": AckKind.COMMIT, "committed_at": sent + timedelta(milliseconds=commit_ms)}
    evaluator = s.evaluator(clock_skew=timedelta(seconds=1))
    assert evaluator.process_bodies([ack(cm, q, read, **extra)]) == int(counts)
    if counts:
        assert not _anomalies(s)
        return
    assert [r.state for r in s.rows(tables.cms)] == ["pending"]
    assert not s.rows(tables.acks)
    (anomaly,) = s.rows(tables.anomalies)
    assert anomaly.kind == "clock_skew"
    assert "tolerance" in anomaly.detail


def _two_of_three(s: Store) -> tuple[str, list[str]]:
    q = s.queue
    names = [f"{q}.{i}" for i in range(3)]
    condition = DestinationSet(
        *(Destination(n) for n in names), process_within=timedelta(seconds=10), min_process=2
    )
    return s.sender.send(b"x", condition), names


def _commit(cm: str, destination: str, at: Any) -> bytes:
    return ack(cm, destination, at, kind=AckKind.COMMIT, committed_at=at)


@pytest.mark.parametrize("one_batch", [False, True])
def test_late_acks_that_change_the_verdict_together_are_flagged(
    store: Store, one_batch: bool
) -> None:
    """Two late COMMIT acks, each committed in time, satisfy ``min_process=2`` together:
    the second is stored ``changes_verdict``, the decision is reported contradicted (once)
    and ``condmsg status`` says so."""
    s = store
    sent = s.clock.at
    cm, names = _two_of_three(s)
    evaluator = s.evaluator()
    s.clock.at = sent + timedelta(seconds=30)
    assert evaluator.sweep() == 1  # nothing processed: violated at the deadline
    in_time = sent + timedelta(seconds=2)
    late = [_commit(cm, names[0], in_time), _commit(cm, names[1], in_time)]
    if one_batch:
        evaluator.process_bodies(late)
    else:
        evaluator.process_bodies(late[:1])
        s.clock.at += timedelta(seconds=1)
        evaluator.process_bodies(late[1:])
    evaluator.process_bodies([_commit(cm, names[2], in_time)])  # contradicts it again
    statuses = sorted(r.status for r in s.rows(tables.acks))
    assert statuses == ["after_decision", "changes_verdict", "changes_verdict"]
    assert _anomalies(s) == {"after_decision": 1, "late_changes_verdict": 2}
    assert [r.state for r in s.rows(tables.cms)] == ["violated"]
    sample = evaluator.registry.get_sample_value
    assert sample("condmsg_evaluator_contradicted_decisions_total") == 1
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert cli(["status", cm, "--db-url", s.engine.url.render_as_string(False)]) == 0
    assert "contradicted by late acks" in out.getvalue()
    assert "would be satisfied, not violated" in out.getvalue()


def test_a_late_ack_that_changes_nothing_is_not_flagged(store: Store) -> None:
    s = store
    sent = s.clock.at
    cm, names = _two_of_three(s)
    evaluator = s.evaluator()
    s.clock.at = sent + timedelta(seconds=30)
    assert evaluator.sweep() == 1
    evaluator.process_bodies([_commit(cm, names[0], sent + timedelta(seconds=2))])
    assert [r.status for r in s.rows(tables.acks)] == ["after_decision"]
    assert (
        evaluator.registry.get_sample_value("condmsg_evaluator_contradicted_decisions_total") == 0
    )
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert cli(["status", cm, "--db-url", s.engine.url.render_as_string(False)]) == 0
    assert "contradicted" not in out.getvalue()
