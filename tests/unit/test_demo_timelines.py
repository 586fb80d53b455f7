"""The demo's timelines of the paper's examples reach the verdicts the paper gives, each as
early as the facts allow."""

from __future__ import annotations

from condmsg.demo.timelines import run, scenarios


def test_demo_timelines_reach_the_expected_verdicts() -> None:
    finals = [list(run(s))[-1][1].verdict.value for s in scenarios()]
    assert finals == ["satisfied", "violated", "satisfied", "violated"]


def test_demo_declares_example1_failure_at_qr3s_processing_deadline() -> None:
    failure = scenarios()[1]
    steps = list(run(failure))
    _, last = steps[-1]
    _, before = steps[-2]
    assert before.verdict.value == "pending"
    assert before.next_check_at is not None
    assert last.verdict.value == "violated"
    assert any("'qr3'" in r and "process" in r for r in last.reasons)
