"""Rendering a condition tree with its evaluation for the terminal (pure, no I/O)."""

from __future__ import annotations

from collections.abc import Sequence

from condmsg.cm_status import ack_line, node_notes
from condmsg.core.acks import Ack
from condmsg.core.conditions import Condition, Destination
from condmsg.core.evaluation import ConstraintResult, EvaluationResult, Truth
from condmsg.core.timeutil import iso

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
        parts.extend(node_notes(node))
        lines.append(f"{prefix}{branch}{node.label}" + (f"  {'; '.join(parts)}" if parts else ""))
        child_prefix = prefix if root else prefix + ("   " if last else "│  ")
        if isinstance(node, Destination):
            mine = [a for a in acks if a.destination == node.name]
            lines.extend(f"{child_prefix}   · {ack_line(ack)}" for ack in mine)
        for index, member in enumerate(node.members):
            visit(member, f"{path}[{index}]", child_prefix, index == len(node.members) - 1, False)

    visit(condition, "root", "", True, True)
    lines.append("")
    lines.append(f"verdict: {result.verdict.value}")
    lines.extend(f"  {reason}" for reason in result.reasons)
    return "\n".join(lines)
