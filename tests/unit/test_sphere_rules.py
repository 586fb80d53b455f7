"""The rules that decide a Dependency-Sphere (``condmsg.core.sphere_evaluation.judge_sphere``) and
the sphere outcome document."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from condmsg.core.errors import ProtocolError
from condmsg.core.evaluation import Verdict
from condmsg.core.outcome import SphereOutcome
from condmsg.core.sphere_evaluation import MemberFacts, SphereFacts, judge_sphere

T0 = datetime(2026, 11, 25, 12, 0, tzinfo=UTC)
S = timedelta(seconds=1)
DEADLINE = T0 + 10 * S


def sphere(
    *members: MemberFacts,
    state: str = "open",
    committed: int | None = None,
    aborted: int | None = None,
    reason: str | None = None,
) -> SphereFacts:
    return SphereFacts(
        "sph",
        state,
        DEADLINE,
        None if committed is None else T0 + committed * S,
        None if aborted is None else T0 + aborted * S,
        reason,
        list(members),
    )


def member(cm_id: str, state: str, at: int | None = None, *reasons: str) -> MemberFacts:
    return MemberFacts(cm_id, state, None if at is None else T0 + at * S, reasons)


def test_committed_with_every_member_satisfied_in_time_is_satisfied() -> None:
    facts = sphere(
        member("a", "satisfied", 2), member("b", "satisfied", 6), state="committed", committed=4
    )
    judged = judge_sphere(facts, T0 + 7 * S)
    assert judged.verdict is Verdict.SATISFIED
    assert judged.effective_at == T0 + 6 * S  # when the last fact came in


def test_a_sphere_waits_for_its_commit_and_its_members() -> None:
    open_ = sphere(member("a", "satisfied", 2))
    assert judge_sphere(open_, T0 + 5 * S).verdict is Verdict.PENDING
    waiting = sphere(
        member("a", "satisfied", 2), member("b", "pending"), state="committed", committed=3
    )
    judged = judge_sphere(waiting, T0 + 5 * S)
    assert judged.verdict is Verdict.PENDING and judged.effective_at is None


def test_a_violated_member_fails_it_at_once_even_while_open() -> None:
    facts = sphere(member("a", "satisfied", 1), member("b", "violated", 3, "qr2 never processed"))
    judged = judge_sphere(facts, T0 + 3 * S)
    assert judged.verdict is Verdict.VIOLATED
    assert judged.reasons == ("member b violated: qr2 never processed",)
    assert judged.effective_at == T0 + 3 * S


def test_the_earliest_violated_member_names_the_failure() -> None:
    facts = sphere(member("late", "violated", 5), member("early", "violated", 2))
    assert judge_sphere(facts, T0 + 6 * S).reasons[0].startswith("member early violated")


def test_an_abort_fails_it() -> None:
    facts = sphere(member("a", "satisfied", 1), state="aborted", aborted=2, reason="cancelled")
    judged = judge_sphere(facts, T0 + 2 * S)
    assert (judged.verdict, judged.reasons) == (Verdict.VIOLATED, ("sphere aborted: cancelled",))
    assert judged.effective_at == T0 + 2 * S


def test_the_timeout_fails_an_uncommitted_sphere_at_its_deadline() -> None:
    facts = sphere(member("a", "satisfied", 1))
    assert judge_sphere(facts, DEADLINE - S).verdict is Verdict.PENDING
    judged = judge_sphere(facts, DEADLINE)
    assert judged.verdict is Verdict.VIOLATED
    assert "not committed" in judged.reasons[0]
    assert judged.effective_at == DEADLINE


def test_a_member_satisfied_after_the_deadline_does_not_save_it() -> None:
    facts = sphere(member("a", "satisfied", 11), state="committed", committed=2)
    judged = judge_sphere(facts, T0 + 12 * S)
    assert judged.verdict is Verdict.VIOLATED
    assert judged.reasons[0].endswith(": 1 member not satisfied")


def test_an_empty_committed_sphere_is_satisfied() -> None:
    judged = judge_sphere(sphere(state="committed", committed=1), T0 + 1 * S)
    assert judged.verdict is Verdict.SATISFIED


states = st.sampled_from(["pending", "satisfied", "violated"])


@given(
    members=st.lists(st.tuples(states, st.integers(0, 20)), max_size=4),
    committed=st.none() | st.integers(0, 9),
    aborted=st.booleans(),
    at=st.integers(0, 25),
)
def test_a_decided_verdict_never_changes_as_time_passes(
    members: list[tuple[str, int]], committed: int | None, aborted: bool, at: int
) -> None:
    facts = sphere(
        *[member(f"m{i}", s, None if s == "pending" else t) for i, (s, t) in enumerate(members)],
        state="aborted" if aborted else ("committed" if committed is not None else "open"),
        committed=committed,
        aborted=3 if aborted else None,
    )
    first = judge_sphere(facts, T0 + at * S)
    later = judge_sphere(facts, T0 + (at + 30) * S)
    if first.decided:
        assert (later.verdict, later.reasons) == (first.verdict, first.reasons)
    assert later.decided  # past the deadline every sphere is decided


def test_the_outcome_document_round_trips() -> None:
    outcome = SphereOutcome(
        sphere_id="sph",
        verdict=Verdict.VIOLATED,
        reasons=("sphere aborted: x",),
        decided_at=T0,
        effective_at=T0 - S,
        members={"b": "pending", "a": "satisfied"},
    )
    assert SphereOutcome.from_json(outcome.to_json()) == outcome
    with pytest.raises(ProtocolError, match="malformed sphere outcome"):
        SphereOutcome.from_json(b'{"sphere_id": "x"}')


def test_the_reasons_count_members_in_words() -> None:
    one = sphere(member("a", "satisfied", 1), state="committed", committed=2)
    assert judge_sphere(one, T0 + 3 * S).reasons == ("committed with its only member satisfied",)
    two = sphere(
        member("a", "satisfied", 1), member("b", "satisfied", 1), state="committed", committed=2
    )
    assert judge_sphere(two, T0 + 3 * S).reasons == ("committed with all 2 members satisfied",)
    late = sphere(
        member("a", "satisfied", 11), member("b", "pending"), state="committed", committed=2
    )
    assert judge_sphere(late, DEADLINE).reasons[0].endswith(": 2 members not satisfied")
