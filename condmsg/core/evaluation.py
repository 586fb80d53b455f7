"""Pure three-valued evaluation of a condition over acknowledgments (DESIGN section 5).

``evaluate(condition, sent_at, acks, now)`` takes time as an argument and does no I/O, so
the evaluator service, the receiver and the Spark audit share one semantics.

Facts are three-valued because a transactional reader reports its read only when it
commits: until the evaluation deadline, a missing read ack may still arrive carrying an
early ``read_at``. Processing facts close at their deadline (a commit ack carries the
commit's own timestamp, so none can come for an instant already past). At the evaluation
deadline every UNKNOWN fact becomes FALSE and the verdict is final.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from enum import Enum, StrEnum

from condmsg.core.acks import Ack, AckKind
from condmsg.core.conditions import Condition, Destination, Kind
from condmsg.core.errors import ConditionError
from condmsg.core.timeutil import RESOLUTION, as_utc, is_aware, iso
from condmsg.core.wording import plural


class Truth(Enum):
    """Kleene's three truth values."""

    TRUE = "true"
    FALSE = "false"
    UNKNOWN = "unknown"


def all_of(values: Iterable[Truth]) -> Truth:
    """Three-valued AND: any FALSE is FALSE, else any UNKNOWN is UNKNOWN, else TRUE."""
    result = Truth.TRUE
    for value in values:
        if value is Truth.FALSE:
            return Truth.FALSE
        if value is Truth.UNKNOWN:
            result = Truth.UNKNOWN
    return result


class Verdict(StrEnum):
    SATISFIED = "satisfied"
    VIOLATED = "violated"
    PENDING = "pending"


@dataclass(frozen=True, slots=True, kw_only=True)
class ConstraintResult:
    """One constraint of one node, judged at one instant."""

    path: str
    node: str
    kind: Kind
    deadline: datetime
    value: Truth
    detail: str
    by_timeout: bool = False

    def describe(self) -> str:
        return (
            f"{self.path} {self.node}: {self.kind} by {iso(self.deadline)} "
            f"{self.value._value_.upper()}: {self.detail}"
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class DestinationFacts:
    """What the acks say about one destination (for outcomes, status and the audit)."""

    name: str
    path: str
    required: bool
    acks: int
    recipients: tuple[str, ...]
    first_read_at: datetime | None
    first_committed_at: datetime | None


@dataclass(frozen=True, slots=True, kw_only=True)
class EvaluationResult:
    """The verdict at ``now`` with the reasons that decided it.

    ``next_check_at`` is set only while PENDING: the earliest instant after ``now`` at which
    the verdict changes without a new ack (a processing deadline passing, or the
    evaluation deadline).
    """

    verdict: Verdict
    reasons: tuple[str, ...]
    next_check_at: datetime | None
    evaluation_deadline: datetime
    final: bool
    constraints: tuple[ConstraintResult, ...]
    destinations: tuple[DestinationFacts, ...]

    @property
    def decided(self) -> bool:
        return self.verdict is not Verdict.PENDING


def evaluate(
    condition: Condition, sent_at: datetime, acks: Iterable[Ack], now: datetime
) -> EvaluationResult:
    """Judge ``condition`` for a CM sent at ``sent_at``, given ``acks``, at instant ``now``.

    All datetimes must be timezone-aware. Acks for destinations not in the tree are
    ignored (the evaluator records them as anomalies before they get here).
    """
    if not isinstance(condition, Condition):
        raise ConditionError(f"condition must be a Condition, got {type(condition).__name__}")
    shape = _shape_of(condition)
    judge = _Judge(condition, _aware("sent_at", sent_at), acks, shape)
    now = _aware("now", now)
    verdict, constraints = judge.at(now)
    next_check_at = None
    if verdict is Verdict.PENDING:
        # The verdict is a step function of time with steps only at these instants, so the
        # first one at which it is no longer PENDING is exactly the next check.
        for instant in judge.breakpoints_after(now):
            if judge.at(instant)[0] is not Verdict.PENDING:
                next_check_at = instant
                break
    return EvaluationResult(
        verdict=verdict,
        reasons=_reasons(verdict, constraints, judge.deadline),
        next_check_at=next_check_at,
        evaluation_deadline=judge.deadline,
        final=now >= judge.deadline,
        constraints=constraints,
        destinations=judge.facts(),
    )


def evaluation_deadline(condition: Condition, sent_at: datetime) -> datetime:
    """``sent_at + evaluation_timeout`` (by default the latest deadline in the tree)."""
    return _aware("sent_at", sent_at) + condition.evaluation_window()


def _aware(name: str, value: object) -> datetime:
    if type(value) is datetime and value.tzinfo is UTC:
        return value  # already what as_utc() would return (the same object)
    if not isinstance(value, datetime):
        raise ConditionError(f"evaluate: {name} must be a datetime, got {type(value).__name__}")
    if not is_aware(value):
        raise ConditionError(f"evaluate: {name} is a naive datetime (timezone-aware UTC required)")
    return as_utc(value)


@dataclass(frozen=True, slots=True)
class _Shape:
    """What evaluating a condition needs of its tree, worked out once per condition."""

    window: timedelta
    leaves: tuple[Destination, ...]
    #: (path, node, its label, kind, duration) of every constraint, in the order judged.
    constraints: tuple[tuple[str, Condition, str, Kind, timedelta], ...]
    #: A processing fact turns FALSE once its deadline is strictly past.
    process_steps: tuple[timedelta, ...]
    #: The destinations with their paths, depth first (for the facts).
    leaf_paths: tuple[tuple[str, Destination], ...]


#: Shapes by condition identity, holding the condition so that its id stays its own. A
#: store decodes each distinct condition document once, so the same objects recur.
_SHAPES: dict[int, tuple[Condition, _Shape]] = {}
_SHAPES_MAX = 4096


def _shape_of(condition: Condition) -> _Shape:
    """The condition validated as a root, and its shape (cached by identity: conditions
    are frozen, so neither validity nor shape can change)."""
    cached = _SHAPES.get(id(condition))
    if cached is not None and cached[0] is condition:
        return cached[1]
    condition.validate()
    nodes = tuple(condition.walk())
    shape = _Shape(
        window=condition.evaluation_window(),
        leaves=condition.destinations(),
        constraints=tuple(
            (path, node, node.label, kind, within)
            for path, node in nodes
            for kind in Kind
            if (within := node.within(kind)) is not None
        ),
        process_steps=tuple(
            node.process_within + RESOLUTION for _, node in nodes if node.process_within is not None
        ),
        leaf_paths=tuple((p, n) for p, n in nodes if isinstance(n, Destination)),
    )
    if len(_SHAPES) >= _SHAPES_MAX:
        _SHAPES.clear()
    _SHAPES[id(condition)] = (condition, shape)
    return shape


class _Judge:
    """The acks of one CM, indexed, judged at any instant."""

    def __init__(
        self, condition: Condition, sent_at: datetime, acks: Iterable[Ack], shape: _Shape
    ) -> None:
        self.condition = condition
        self.shape = shape
        self.sent_at = sent_at
        self.deadline = sent_at + shape.window
        by_name: dict[str, list[Ack]] = defaultdict(list)
        for ack in acks:
            if not isinstance(ack, Ack):
                raise ConditionError(f"evaluate: acks must be Ack, got {type(ack).__name__}")
            by_name[ack.destination].append(ack)
        self.acks: dict[str, tuple[Ack, ...]] = {}
        for leaf in shape.leaves:
            matching = by_name.get(leaf.name, [])
            if leaf.recipient is not None:
                matching = [a for a in matching if a.recipient == leaf.recipient]
            self.acks[leaf.name] = tuple(matching)

    def breakpoints_after(self, now: datetime) -> list[datetime]:
        instants = {self.deadline}
        for step in self.shape.process_steps:
            instants.add(self.sent_at + step)
        return sorted(i for i in instants if i > now)

    def at(self, now: datetime) -> tuple[Verdict, tuple[ConstraintResult, ...]]:
        final = now >= self.deadline
        results: list[ConstraintResult] = []
        overall = Truth.TRUE
        for path, node, label, kind, within in self.shape.constraints:
            deadline = self.sent_at + within
            value, detail = self.holds(node, kind, deadline, now, final)
            by_timeout = (
                final
                and value is Truth.FALSE
                and self.holds(node, kind, deadline, now, False)[0] is Truth.UNKNOWN
            )
            results.append(
                ConstraintResult(
                    path=path,
                    node=label,
                    kind=kind,
                    deadline=deadline,
                    value=value,
                    detail=detail,
                    by_timeout=by_timeout,
                )
            )
            # all_of over the values, as they come.
            if value is Truth.FALSE:
                overall = Truth.FALSE
            elif value is Truth.UNKNOWN and overall is Truth.TRUE:
                overall = Truth.UNKNOWN
        if overall is Truth.TRUE:
            return Verdict.SATISFIED, tuple(results)
        if overall is Truth.FALSE:
            return Verdict.VIOLATED, tuple(results)
        return Verdict.PENDING, tuple(results)

    # -- the recursive rule -----------------------------------------------------------

    def holds(
        self, node: Condition, kind: Kind, deadline: datetime, now: datetime, final: bool
    ) -> tuple[Truth, str]:
        """Does ``node`` hold constraint ``kind`` at ``deadline``, by its own rule for it?"""
        if isinstance(node, Destination):
            return self._destination(node, kind, deadline, now, final)
        values = [(m, self.holds(m, kind, deadline, now, final)[0]) for m in node.members]
        held = [_name(m) for m, v in values if v is Truth.TRUE]
        failed = [_name(m) for m, v in values if v is Truth.FALSE]
        unknown = [_name(m) for m, v in values if v is Truth.UNKNOWN]
        if node.has_counts(kind):
            value = _count_rule(len(held), len(unknown), node.min_count(kind), node.max_count(kind))
            rule = _describe_counts(node.min_count(kind), node.max_count(kind), len(values))
        else:
            value = all_of(v for _, v in values)
            rule = "its only member" if len(values) == 1 else f"all {len(values)} members"
        return value, f"{rule}: {_tally(held, failed, unknown)}"

    def _destination(
        self, node: Destination, kind: Kind, deadline: datetime, now: datetime, final: bool
    ) -> tuple[Truth, str]:
        acks = self.acks[node.name]
        if not node.is_topic:
            return _single(acks, kind, deadline, now, final)
        # A topic destination: each recipient's subscription copy is consumed once, and
        # recipients nobody has heard from yet may still report until the fact closes.
        by_recipient: dict[str, list[Ack]] = defaultdict(list)
        for ack in acks:
            by_recipient[ack.recipient or "(anonymous)"].append(ack)
        held = sorted(
            r
            for r, mine in by_recipient.items()
            if _single(mine, kind, deadline, now, final)[0] is Truth.TRUE
        )
        pool_open = not final and (kind is Kind.PICKUP or now <= deadline)
        unseen = None if pool_open else 0
        who = f"in time: {', '.join(held) or 'nobody'}"
        if node.has_counts(kind):
            value = _count_rule(len(held), unseen, node.min_count(kind), node.max_count(kind))
            return (
                value,
                f"{_describe_counts(node.min_count(kind), node.max_count(kind), None)}; {who}",
            )
        if held:
            return Truth.TRUE, who
        return (Truth.UNKNOWN if pool_open else Truth.FALSE), who

    def facts(self) -> tuple[DestinationFacts, ...]:
        found: list[DestinationFacts] = []
        for path, node in self.shape.leaf_paths:
            acks = self.acks[node.name]
            if len(acks) == 1:  # the usual case, without the generic folds
                (ack,) = acks
                recipients: tuple[str, ...] = (ack.recipient,) if ack.recipient else ()
                first_read: datetime | None = ack.read_at
                first_commit = ack.committed_at
            else:
                recipients = tuple(sorted({a.recipient for a in acks if a.recipient}))
                first_read = min((a.read_at for a in acks), default=None)
                first_commit = min(
                    (a.committed_at for a in acks if a.committed_at is not None), default=None
                )
            found.append(
                DestinationFacts(
                    name=node.name,
                    path=path,
                    required=node.is_required,
                    acks=len(acks),
                    recipients=recipients,
                    first_read_at=first_read,
                    first_committed_at=first_commit,
                )
            )
        return tuple(found)


def _single(
    acks: Sequence[Ack], kind: Kind, deadline: datetime, now: datetime, final: bool
) -> tuple[Truth, str]:
    """The fact for one consumption (a queue copy, or one recipient's topic copy)."""
    if kind is Kind.PICKUP:
        in_time = [a.read_at for a in acks if a.read_at <= deadline]
        if in_time:
            return Truth.TRUE, f"read at {iso(min(in_time))}"
        if acks:
            # The copy is consumed once: this ack was its only consumption, and late.
            return Truth.FALSE, f"read late at {iso(min(a.read_at for a in acks))}"
        if final:
            return Truth.FALSE, "no read ack by the evaluation deadline"
        return Truth.UNKNOWN, "no read ack yet"
    commits = [a.committed_at for a in acks if a.kind is AckKind.COMMIT and a.committed_at]
    in_time = [c for c in commits if c <= deadline]
    if in_time:
        return Truth.TRUE, f"processed, committed at {iso(min(in_time))}"
    if commits:
        return Truth.FALSE, f"committed late at {iso(min(commits))}"
    if acks:
        return Truth.FALSE, "read without a transaction (READ ack): never processed"
    if now > deadline or final:
        return Truth.FALSE, "no commit ack by the deadline"
    return Truth.UNKNOWN, "no commit ack yet"


def _count_rule(held: int, unknown: int | None, low: int | None, high: int | None) -> Truth:
    """``min``/``max`` over ``held`` TRUE and ``unknown`` UNKNOWN (None: unbounded)."""
    parts: list[Truth] = []
    if low is not None:
        if held >= low:
            parts.append(Truth.TRUE)
        elif unknown is not None and held + unknown < low:
            parts.append(Truth.FALSE)
        else:
            parts.append(Truth.UNKNOWN)
    if high is not None:
        if held > high:
            parts.append(Truth.FALSE)
        elif unknown is not None and held + unknown <= high:
            parts.append(Truth.TRUE)
        else:
            parts.append(Truth.UNKNOWN)
    return all_of(parts)


def _describe_counts(low: int | None, high: int | None, size: int | None) -> str:
    bounds = " and ".join(
        text
        for text in (
            f"at least {low}" if low is not None else "",
            f"at most {high}" if high is not None else "",
        )
        if text
    )
    of = f"of {plural(size, 'member')}" if size is not None else "distinct recipients"
    return f"{bounds} {of}"


def _tally(held: list[str], failed: list[str], unknown: list[str]) -> str:
    parts = [
        f"{label} {', '.join(names)}"
        for label, names in (("held:", held), ("failed:", failed), ("unknown:", unknown))
        if names
    ]
    return "; ".join(parts)


def _name(node: Condition) -> str:
    return node.name if isinstance(node, Destination) else node.label


def _reasons(
    verdict: Verdict, constraints: Sequence[ConstraintResult], deadline: datetime
) -> tuple[str, ...]:
    if verdict is Verdict.SATISFIED:
        wanted = Truth.TRUE
    elif verdict is Verdict.VIOLATED:
        wanted = Truth.FALSE
    else:
        wanted = Truth.UNKNOWN
    reasons = [c.describe() for c in constraints if c.value is wanted]
    if verdict is Verdict.VIOLATED and any(
        c.by_timeout for c in constraints if c.value is Truth.FALSE
    ):
        reasons.insert(0, f"evaluation timeout at {iso(deadline)}: acks still missing")
    if verdict is Verdict.PENDING:
        reasons = [f"waiting: {r}" for r in reasons]
    return tuple(reasons)


__all__ = [
    "ConstraintResult",
    "DestinationFacts",
    "EvaluationResult",
    "Truth",
    "Verdict",
    "all_of",
    "evaluate",
    "evaluation_deadline",
]
