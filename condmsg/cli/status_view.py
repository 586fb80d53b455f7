"""Rendering a condition tree with its evaluation for the terminal (pure, no I/O)."""

from __future__ import annotations

from collections.abc import Sequence

from condmsg.acks import Ack
from condmsg.conditions import Condition, Destination
from condmsg.evaluation import ConstraintResult, EvaluationResult, Truth
from condmsg.timeutil import describe_duration, iso

_MARK = {Truth.TRUE: "✓", Truth.FALSE: "✗", Truth.UNKNOWN: "…"}


def render(condition: Condition, result: EvaluationResult, acks: Sequence[Ack]) -> str:
    """The tree, one node a line, with its constraints (held ✓, failed ✗, open …) and,
    under each destination, the acks that count for it; then the verdict and reasons."""
    by_path: dict[str, list[ConstraintResult]] = {}
    for constraint in result.constraints:
        by_path.setdefault(constraint.path, []).append(constraint)
    lines: list[str] = []

    def visit(node: Condition, path: str, prefix: str, last: bool, root: bool) -> None:
        branch = "" if root else ("└─ " if last else "├─ ")
        parts = [f"{_MARK[c.value]} {c.kind} by {iso(c.deadline)}" for c in by_path.get(path, [])]
        for kind in ("pickup", "process"):
            low, high = getattr(node, f"min_{kind}"), getattr(node, f"max_{kind}")
            if low is not None or high is not None:
                bounds = f"{low if low is not None else 0}..{high if high is not None else '*'}"
                parts.append(f"{kind} count [{bounds}]")
        if node.evaluation_timeout is not None:
            parts.append(f"evaluation timeout {describe_duration(node.evaluation_timeout)}")
        lines.append(f"{prefix}{branch}{node.label}" + (f"  {'; '.join(parts)}" if parts else ""))
        child_prefix = prefix if root else prefix + ("   " if last else "│  ")
        if isinstance(node, Destination):
            mine = [a for a in acks if a.destination == node.name]
            for ack in mine:
                when = f"read {iso(ack.read_at)}"
                if ack.committed_at is not None:
                    when += f", committed {iso(ack.committed_at)}"
                who = f" by {ack.recipient}" if ack.recipient else ""
                lines.append(f"{child_prefix}   · {ack.kind.value} ack{who}: {when}")
        for index, member in enumerate(node.members):
            visit(member, f"{path}[{index}]", child_prefix, index == len(node.members) - 1, False)

    visit(condition, "root", "", True, True)
    lines.append("")
    lines.append(f"verdict: {result.verdict.value}")
    lines.extend(f"  {reason}" for reason in result.reasons)
    return "\n".join(lines)


def contradiction(stored_state: str, with_late: EvaluationResult, late_acks: int) -> str | None:
    """The line saying that a decided CM's late acks, judged with the counted ones at the
    decision's effective instant, give another verdict; None if they do not (or if the
    CM is pending)."""
    if stored_state == "pending" or late_acks == 0:
        return None
    if with_late.verdict.value == stored_state:
        return None
    return (
        f"contradicted by late acks: with the {late_acks} ack(s) received after the decision "
        f"the verdict would be {with_late.verdict.value}, not {stored_state} "
        "(the ack grace was too short for them)"
    )
