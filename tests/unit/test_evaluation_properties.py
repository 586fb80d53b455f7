"""Properties of the condition model and of ``evaluate`` over random trees and ack histories.

Besides the properties DESIGN section 5 states outright (a decided verdict never changes as
``now`` grows; never PENDING at the evaluation deadline; ``next_check_at`` is the next
instant the verdict can change), ``evaluate`` is compared with a small reference
evaluator written here straight from the text of DESIGN section 5.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from condmsg import (
    Ack,
    AckKind,
    Condition,
    Destination,
    Truth,
    Verdict,
    evaluate,
    evaluation_deadline,
)
from condmsg.core.condition_codec import (
    condition_from_dict,
    condition_from_json,
    condition_to_dict,
    condition_to_json,
)
from condmsg.core.timeutil import RESOLUTION
from tests.unit.strategies import (
    ack_histories,
    any_acks,
    conditions,
    evaluation_window,
    in_time_history,
    instants,
    scenarios,
    sent_ats,
    turning_points,
)

PROPERTY = settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

T, F, U = Truth.TRUE, Truth.FALSE, Truth.UNKNOWN


# -- a reference evaluator, from the text of DESIGN section 5 ---------------------------


def _and(values: Iterable[Truth]) -> Truth:
    values = list(values)
    if F in values:
        return F
    return U if U in values else T


def _count(t: int, u: float, low: int | None, high: int | None) -> Truth:
    parts = []
    if low is not None:
        parts.append(T if t >= low else F if t + u < low else U)
    if high is not None:
        parts.append(F if t > high else T if t + u <= high else U)
    return _and(parts)


def _fact(acks: Sequence[Ack], kind: str, d: datetime, now: datetime, final: bool) -> Truth:
    """One consumption's fact; at the evaluation deadline UNKNOWN becomes FALSE."""
    if kind == "pickup":
        if any(a.read_at <= d for a in acks):
            return T
        if acks:  # its only consumption, acked late
            return F
        return F if final else U
    if any(a.kind is AckKind.COMMIT and a.committed_at <= d for a in acks):  # type: ignore[operator]
        return T
    if acks:  # a READ ack, or a commit after D
        return F
    return F if (now > d or final) else U


def _holds(
    node: Condition,
    kind: str,
    d: datetime,
    now: datetime,
    final: bool,
    by_dest: dict[str, list[Ack]],
) -> Truth:
    low, high = getattr(node, f"min_{kind}"), getattr(node, f"max_{kind}")
    counted = low is not None or high is not None
    if isinstance(node, Destination):
        mine = [
            a for a in by_dest[node.name] if node.recipient is None or a.recipient == node.recipient
        ]
        if node.exchange is None:
            return _fact(mine, kind, d, now, final)
        # Topic: one consumption per distinct recipient; more may still report while the
        # fact is open (pickup: until the evaluation deadline; process: until D).
        per: dict[str | None, list[Ack]] = defaultdict(list)
        for a in mine:
            per[a.recipient].append(a)
        t = sum(_fact(acks, kind, d, now, final) is T for acks in per.values())
        still_open = not final and (kind == "pickup" or now <= d)
        if counted:
            return _count(t, float("inf") if still_open else 0, low, high)
        return T if t else (U if still_open else F)
    values = [_holds(m, kind, d, now, final, by_dest) for m in node.members]
    if counted:
        return _count(values.count(T), values.count(U), low, high)
    return _and(values)


def reference_constraints(
    condition: Condition, sent_at: datetime, acks: Sequence[Ack], now: datetime
) -> list[tuple[str, str, Truth]]:
    """``(path, kind, value)`` of every constraint of every node, depth first."""
    final = now >= sent_at + evaluation_window(condition)
    by_dest: dict[str, list[Ack]] = defaultdict(list)
    for a in acks:
        by_dest[a.destination].append(a)
    return [
        (path, kind, _holds(node, kind, sent_at + within, now, final, by_dest))
        for path, node in condition.walk()
        for kind, within in (("pickup", node.pickup_within), ("process", node.process_within))
        if within is not None
    ]


def reference_verdict(
    condition: Condition, sent_at: datetime, acks: Sequence[Ack], now: datetime
) -> Verdict:
    overall = _and(v for _, _, v in reference_constraints(condition, sent_at, acks, now))
    return {T: Verdict.SATISFIED, F: Verdict.VIOLATED, U: Verdict.PENDING}[overall]


def reference_next_check(
    condition: Condition, sent_at: datetime, acks: Sequence[Ack], now: datetime
) -> datetime | None:
    """The first processing deadline (+1 us) or evaluation deadline that decides it."""
    if reference_verdict(condition, sent_at, acks, now) is not Verdict.PENDING:
        return None
    candidates = {sent_at + evaluation_window(condition)}
    for _, node in condition.walk():
        if node.process_within is not None:
            candidates.add(sent_at + node.process_within + RESOLUTION)
    for instant in sorted(c for c in candidates if c > now):
        if reference_verdict(condition, sent_at, acks, instant) is not Verdict.PENDING:
            return instant
    raise AssertionError("PENDING at and after the evaluation deadline")


# -- properties -------------------------------------------------------------------------


@PROPERTY
@given(scenarios())
def test_constraints_verdict_and_next_check_match_the_reference(scenario) -> None:  # type: ignore[no-untyped-def]
    condition, sent_at, acks, now = scenario
    result = evaluate(condition, sent_at, acks, now)
    judged = [(c.path, str(c.kind), c.value) for c in result.constraints]
    assert judged == reference_constraints(condition, sent_at, acks, now)
    assert result.verdict is reference_verdict(condition, sent_at, acks, now)
    assert result.next_check_at == reference_next_check(condition, sent_at, acks, now)


@PROPERTY
@given(conditions(broker_properties=True))
def test_json_round_trip_is_identity(condition: Condition) -> None:
    text = condition_to_json(condition)
    decoded = condition_from_json(text)
    assert decoded == condition
    assert condition_to_json(decoded) == text
    assert condition_from_dict(condition_to_dict(condition)) == condition


@PROPERTY
@given(scenarios(), st.data())
def test_a_decided_verdict_never_changes_as_now_grows(scenario, data) -> None:  # type: ignore[no-untyped-def]
    condition, sent_at, acks, now = scenario
    first = evaluate(condition, sent_at, acks, now)
    ahead = [t for t in turning_points(condition, sent_at) if t >= now] or [now]
    step = st.integers(min_value=0, max_value=evaluation_window(condition) // RESOLUTION)
    later = data.draw(st.sampled_from(ahead) | step.map(lambda us: now + us * RESOLUTION))
    again = evaluate(condition, sent_at, acks, later)
    if first.decided:
        assert again.verdict is first.verdict
    # And from any later instant, looking back: PENDING later means PENDING now.
    if again.verdict is Verdict.PENDING:
        assert first.verdict is Verdict.PENDING


@PROPERTY
@given(scenarios(), st.data())
def test_never_pending_at_or_after_the_evaluation_deadline(scenario, data) -> None:  # type: ignore[no-untyped-def]
    condition, sent_at, acks, _ = scenario
    deadline = sent_at + evaluation_window(condition)
    assert evaluation_deadline(condition, sent_at) == deadline
    offset = data.draw(st.sampled_from([0, 1]) | st.integers(min_value=0, max_value=10**8))
    now = deadline + offset * RESOLUTION
    result = evaluate(condition, sent_at, acks, now)
    assert result.verdict is not Verdict.PENDING
    assert result.final
    assert result.next_check_at is None
    assert result.evaluation_deadline == deadline


@PROPERTY
@given(scenarios(), st.data())
def test_next_check_at_is_after_now_and_nothing_changes_before_it(scenario, data) -> None:  # type: ignore[no-untyped-def]
    condition, sent_at, acks, now = scenario
    result = evaluate(condition, sent_at, acks, now)
    if result.verdict is not Verdict.PENDING:
        assert result.next_check_at is None
        return
    check = result.next_check_at
    assert check is not None
    assert now < check <= result.evaluation_deadline
    assert not result.final
    gap_us = (check - now) // RESOLUTION
    samples = {now, check - RESOLUTION}
    samples.update(
        now + us * RESOLUTION
        for us in data.draw(
            st.lists(st.integers(min_value=0, max_value=gap_us - 1), min_size=1, max_size=5)
        )
    )
    samples.update(t for t in turning_points(condition, sent_at) if now <= t < check)
    for instant in sorted(samples):
        assert evaluate(condition, sent_at, acks, instant).verdict is Verdict.PENDING, instant
    assert evaluate(condition, sent_at, acks, check).verdict is not Verdict.PENDING


@PROPERTY
@given(conditions(max_counts=False), sent_ats(), st.data())
def test_adding_any_ack_keeps_a_satisfied_verdict_without_max_counts(
    condition: Condition, sent_at: datetime, data: st.DataObject
) -> None:
    history = in_time_history(condition, sent_at)
    now = data.draw(instants(condition, sent_at))
    # Everybody read and committed at sent_at: satisfied at once, whatever the instant.
    assert evaluate(condition, sent_at, history, now).verdict is Verdict.SATISFIED
    extra = data.draw(st.lists(any_acks(condition, sent_at), min_size=1, max_size=4))
    grown = data.draw(st.permutations(history + extra))
    assert evaluate(condition, sent_at, grown, now).verdict is Verdict.SATISFIED


@PROPERTY
@given(conditions(max_counts=False), sent_ats(), st.data())
def test_adding_an_ack_to_a_random_satisfied_history_keeps_it(
    condition: Condition, sent_at: datetime, data: st.DataObject
) -> None:
    history = data.draw(ack_histories(condition, sent_at, consumed_once=False))
    now = data.draw(instants(condition, sent_at))
    extra = data.draw(any_acks(condition, sent_at))
    if evaluate(condition, sent_at, history, now).verdict is Verdict.SATISFIED:
        assert evaluate(condition, sent_at, [*history, extra], now).verdict is Verdict.SATISFIED


@PROPERTY
@given(scenarios(), st.data())
def test_ack_order_duplicates_and_strays_do_not_matter(scenario, data) -> None:  # type: ignore[no-untyped-def]
    condition, sent_at, acks, now = scenario
    base = evaluate(condition, sent_at, acks, now)
    shuffled = data.draw(st.permutations(acks))
    stray = Ack(destination="zz-not-in-the-tree", kind=AckKind.READ, read_at=sent_at)
    noisy = [*shuffled, *shuffled[:2], stray]
    other = evaluate(condition, sent_at, noisy, now)
    assert other.verdict is base.verdict
    assert other.next_check_at == base.next_check_at
    assert [c.value for c in other.constraints] == [c.value for c in base.constraints]


@PROPERTY
@given(scenarios())
def test_evaluation_never_raises_and_the_result_is_consistent(scenario) -> None:  # type: ignore[no-untyped-def]
    condition, sent_at, acks, now = scenario
    result = evaluate(condition, sent_at, acks, now)
    assert result.final is (now >= result.evaluation_deadline)
    assert result.decided is (result.verdict is not Verdict.PENDING)
    assert result.reasons, "every verdict carries at least one reason"
    constrained = [
        (path, kind)
        for path, node in condition.walk()
        for kind, within in (("pickup", node.pickup_within), ("process", node.process_within))
        if within is not None
    ]
    assert [(c.path, str(c.kind)) for c in result.constraints] == constrained
    wanted = {Verdict.SATISFIED: T, Verdict.VIOLATED: F, Verdict.PENDING: U}[result.verdict]
    if result.verdict is Verdict.SATISFIED:
        assert all(c.value is T for c in result.constraints)
    else:
        assert any(c.value is wanted for c in result.constraints)
    assert [f.name for f in result.destinations] == [d.name for d in condition.destinations()]


@PROPERTY
@given(scenarios(), st.sampled_from([-7, 0, 3]))
def test_the_timezone_of_the_inputs_does_not_matter(scenario, hours) -> None:  # type: ignore[no-untyped-def]
    from datetime import timezone

    condition, sent_at, acks, now = scenario
    zone = timezone(timedelta(hours=hours))
    shifted = [
        Ack(
            destination=a.destination,
            kind=a.kind,
            read_at=a.read_at.astimezone(zone),
            committed_at=a.committed_at.astimezone(zone) if a.committed_at else None,
            recipient=a.recipient,
        )
        for a in acks
    ]
    base = evaluate(condition, sent_at, acks, now)
    other = evaluate(condition, sent_at.astimezone(zone), shifted, now.astimezone(zone))
    assert other.verdict is base.verdict
    assert other.next_check_at == base.next_check_at
    assert other.evaluation_deadline == base.evaluation_deadline
