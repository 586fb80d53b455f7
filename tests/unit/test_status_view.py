"""The terminal tree of ``condmsg status``."""

from __future__ import annotations

from condmsg.cli.status_view import render
from condmsg.demo.timelines import run, scenarios


def test_the_tree_marks_each_constraint_and_lists_the_acks_under_their_destination() -> None:
    scenario = scenarios()[1]  # Example 1, qr3 never commits
    steps = list(run(scenario))
    acks = [step.ack for step, _ in steps if step.ack is not None]
    text = render(scenario.condition, steps[-1][1], acks)
    lines = text.splitlines()
    assert lines[0].startswith("set{qr3,set{qr1,qr2,qr4}}  … pickup by")
    assert lines[1].startswith("├─ 'qr3'  ✗ process by")
    assert "✓ process by" in lines[2] and "process count [2..*]" in lines[2]
    qr1 = lines.index("   ├─ 'qr1'")
    assert lines[qr1 + 1].lstrip(" │").startswith("· read ack: read ")
    assert "verdict: violated" in lines
    assert lines[-1].strip().startswith("root[0] 'qr3': process by")
