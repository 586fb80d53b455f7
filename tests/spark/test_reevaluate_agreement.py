"""The Spark re-evaluation agrees with ``condmsg.evaluate`` on generated histories.

Each hypothesis example is a *batch* of histories (condition, acks, instant) evaluated in
one DataFrame, through the native path and through the ``mapInArrow`` fallback, so a few
Spark jobs cover dozens of histories.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from condmsg.acks import Ack, AckKind
from condmsg.conditions import Condition, Destination, DestinationSet
from condmsg.errors import ConditionError
from condmsg.evaluation import evaluate
from spark_audit.plans import plan_of
from spark_audit.reevaluate import recompute
from spark_audit.transforms.conditions import condition_plans, with_plans
from tests.spark.builders import T0, ack_row, cm_row, frame
from tests.spark.conftest import SPARK_MARKS

pytestmark = list(SPARK_MARKS)

MS = [500, 1000, 2000, 3000, 5000]
NAMES = ["q1", "q2", "q3", "q4"]
RECIPIENTS = [None, "r1", "r2"]


def _maybe_ms(draw: st.DrawFn, p_none: float = 0.5) -> timedelta | None:
    if draw(st.floats(0, 1)) < p_none:
        return None
    return timedelta(milliseconds=draw(st.sampled_from(MS)))


def _counts(draw: st.DrawFn, size: int, has_deadline: bool) -> tuple[int | None, int | None]:
    if not has_deadline or draw(st.booleans()):
        return None, None
    low = draw(st.one_of(st.none(), st.integers(0, size)))
    high = draw(st.one_of(st.none(), st.integers(low or 0, size)))
    return low, high


@st.composite
def queue(draw: st.DrawFn, name: str, own: bool = True) -> Destination:
    return Destination(
        name,
        recipient=draw(st.sampled_from(RECIPIENTS)) if draw(st.booleans()) else None,
        pickup_within=_maybe_ms(draw, 0.6) if own else None,
        process_within=_maybe_ms(draw, 0.7) if own else None,
    )


@st.composite
def flat_set(draw: st.DrawFn) -> Condition:
    size = draw(st.integers(1, 4))
    members = [draw(queue(n)) for n in NAMES[:size]]
    pickup, process = _maybe_ms(draw), _maybe_ms(draw)
    min_p, max_p = _counts(draw, size, pickup is not None)
    min_c, max_c = _counts(draw, size, process is not None)
    return DestinationSet(
        *members,
        pickup_within=pickup,
        process_within=process,
        min_pickup=min_p,
        max_pickup=max_p,
        min_process=min_c,
        max_process=max_c,
    )


@st.composite
def complex_tree(draw: st.DrawFn) -> Condition:
    """Nested sets and topic destinations: the fallback path's territory."""
    inner = DestinationSet(
        draw(queue("q2")),
        draw(queue("q3")),
        process_within=_maybe_ms(draw, 0.3),
        min_process=draw(st.sampled_from([None, 1, 2])),
    )
    topic = Destination(
        "q4",
        exchange="ex",
        pickup_within=_maybe_ms(draw, 0.3),
        min_pickup=draw(st.sampled_from([None, 1, 2])),
    )
    return DestinationSet(draw(queue("q1")), inner, topic, pickup_within=_maybe_ms(draw))


@st.composite
def conditions(draw: st.DrawFn) -> Condition:
    kind = draw(st.sampled_from(["single", "flat", "complex"]))
    try:
        if kind == "single":
            node: Condition = draw(queue("q1"))
        elif kind == "flat":
            node = draw(flat_set())
        else:
            node = draw(complex_tree())
        if draw(st.booleans()):
            window = node.evaluation_window() + timedelta(milliseconds=draw(st.sampled_from(MS)))
            node = _with_timeout(node, window)
        node.validate()
    except ConditionError:
        node = Destination("q1", pickup_within=timedelta(seconds=1))
    return node


def _with_timeout(node: Condition, timeout: timedelta) -> Condition:
    data = node.to_dict()
    data["condition"]["evaluation_timeout_ms"] = timeout // timedelta(milliseconds=1)
    return Condition.from_dict(data)


@st.composite
def histories(draw: st.DrawFn) -> dict[str, Any]:
    condition = draw(conditions())
    acks: list[Ack] = []
    for _ in range(draw(st.integers(0, 6))):
        read = T0 + timedelta(milliseconds=draw(st.integers(-500, 7000)))
        commit = None
        if draw(st.booleans()):
            commit = read + timedelta(milliseconds=draw(st.integers(0, 4000)))
        acks.append(
            Ack(
                destination=draw(st.sampled_from([*NAMES, "elsewhere"])),
                kind=AckKind.COMMIT if commit else AckKind.READ,
                read_at=read,
                committed_at=commit,
                recipient=draw(st.sampled_from(RECIPIENTS)),
            )
        )
    deadlines = [T0 + d for d in condition.deadlines()]
    deadlines.append(T0 + condition.evaluation_window())
    one_us = timedelta(microseconds=1)
    now = draw(
        st.one_of(
            st.builds(lambda ms: T0 + timedelta(milliseconds=ms), st.integers(0, 12000)),
            st.sampled_from(deadlines).flatmap(
                lambda d: st.sampled_from([d - one_us, d, d + one_us])
            ),
        )
    )
    return {"condition": condition, "acks": acks, "now": now}


def _frames(spark: Any, batch: list[dict[str, Any]]) -> tuple[Any, Any]:
    cm_rows, ack_rows = [], []
    for i, history in enumerate(batch):
        cm_rows.append(cm_row(f"cm{i}", history["condition"]))
        for j, ack in enumerate(history["acks"]):
            ack_rows.append(
                ack_row(
                    f"a{i}.{j}",
                    f"cm{i}",
                    ack.destination,
                    read_at=ack.read_at,
                    committed_at=ack.committed_at,
                    recipient=ack.recipient,
                )
            )
    cms = frame(spark, "cms", cm_rows)
    planned = with_plans(cms, condition_plans(cms))
    nows = spark.createDataFrame(
        [(f"cm{i}", h["now"]) for i, h in enumerate(batch)], "cm_id string, at timestamp"
    )
    # Checkpointed so the two paths below do not decode the conditions again.
    cases = planned.join(nows, "cm_id").localCheckpoint()
    return cases, frame(spark, "acks", ack_rows).localCheckpoint()


def _check(spark: Any, batch: list[dict[str, Any]]) -> None:
    cases, acks = _frames(spark, batch)
    expected = {
        f"cm{i}": evaluate(h["condition"], T0, h["acks"], h["now"]).verdict.value
        for i, h in enumerate(batch)
    }
    for native in (True, False):
        rows = recompute(cases, acks, native=native).collect()
        got = {r["cm_id"]: r["verdict"] for r in rows}
        paths = {r["path"] for r in rows}
        assert got == expected, (native, paths)
        if not native:
            assert paths == {"python"}


@settings(
    max_examples=4,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(batch=st.lists(histories(), min_size=40, max_size=60))
def test_spark_reevaluation_agrees_with_evaluate(spark: Any, batch: list[dict[str, Any]]) -> None:
    _check(spark, batch)


def test_generated_batches_exercise_both_paths() -> None:
    # The strategy must produce native and non-native conditions, or the test above
    # would silently cover one path only.
    native = {plan_of(c.to_json()).native for c in _sample_conditions()}
    assert native == {True, False}


def _sample_conditions() -> list[Condition]:
    found: list[Condition] = []

    @settings(max_examples=60, derandomize=True, database=None)
    @given(conditions())
    def collect(condition: Condition) -> None:
        found.append(condition)

    collect()
    return found


def test_paper_example2_boundaries(spark: Any) -> None:
    condition = Destination("qcentral", pickup_within=timedelta(seconds=1))
    late = Ack(destination="qcentral", kind=AckKind.READ, read_at=T0 + timedelta(milliseconds=1000))
    one_us = timedelta(microseconds=1)
    instants = [T0 + timedelta(milliseconds=ms) for ms in (999, 1000, 2000, 5000)]
    instants += [T0 + timedelta(seconds=1) + one_us]
    batch = [
        {"condition": condition, "acks": acks, "now": now}
        for now in instants
        for acks in ([], [late])
    ]
    _check(spark, batch)
