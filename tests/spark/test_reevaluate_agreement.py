"""The Spark re-evaluation agrees with ``condmsg.evaluate`` on generated histories.

Each hypothesis example is a *batch* of histories (condition, acks, instant) evaluated in
one DataFrame, through the native path and through the ``mapInArrow`` fallback, so a few
Spark jobs cover dozens of histories.
"""

from __future__ import annotations

import random
from datetime import datetime, timedelta
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from condmsg.core.acks import Ack, AckKind
from condmsg.core.condition_codec import condition_from_dict, condition_to_dict, condition_to_json
from condmsg.core.conditions import Condition, Destination, DestinationSet
from condmsg.core.errors import ConditionError
from condmsg.core.evaluation import evaluate
from spark_audit.plans import plan_of
from spark_audit.reevaluate.recompute import recompute
from tests.spark.builders import T0, ack_row, cm_row, frame
from tests.spark.conftest import SPARK_MARKS

pytestmark = list(SPARK_MARKS)

MS = [500, 1000, 2000, 3000, 5000]
NAMES = ["q1", "q2", "q3", "q4", "q5", "q6"]
RECIPIENTS = [None, "r1", "r2", "r3"]
KINDS = ("pickup", "process")


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


def _constraints(
    draw: st.DrawFn, size: int, covered: frozenset[str], p_none: float
) -> tuple[dict[str, Any], frozenset[str]]:
    """Deadlines and counts for a node whose ancestors cover ``covered`` kinds."""
    attrs: dict[str, Any] = {}
    here = set(covered)
    for kind in KINDS:
        within = _maybe_ms(draw, p_none)
        if within is not None:
            attrs[f"{kind}_within"] = within
            here.add(kind)
    for kind in KINDS:
        low, high = _counts(draw, size, kind in here)
        if low is not None:
            attrs[f"min_{kind}"] = low
        if high is not None:
            attrs[f"max_{kind}"] = high
    return attrs, frozenset(here)


@st.composite
def node(
    draw: st.DrawFn, names: list[str], depth: int, covered: frozenset[str], reserve: int = 0
) -> Condition:
    """A random subtree: queues (maybe with a recipient), topics (maybe with counts of
    recipients) and sets (maybe with counts), up to ``depth`` levels of nesting, leaving
    ``reserve`` names for later siblings."""
    free = len(names) - reserve
    kind = draw(
        st.sampled_from(["queue", "topic", "set"] if depth > 0 and free > 1 else ["queue", "topic"])
    )
    if kind == "set":
        size = draw(st.integers(1, min(3, free)))
        attrs, here = _constraints(draw, size, covered, 0.6)
        members = [draw(node(names, depth - 1, here, reserve + size - 1 - m)) for m in range(size)]
        return DestinationSet(*members, **attrs)
    name = names.pop(0)
    if kind == "queue":
        attrs, _ = _constraints(draw, 0, frozenset(), 0.6)
        recipient = draw(st.sampled_from(RECIPIENTS)) if draw(st.booleans()) else None
        return Destination(name, recipient=recipient, **attrs)
    attrs, _ = _constraints(draw, 3, covered, 0.6)
    if any(k.startswith(("min_", "max_")) for k in attrs) or draw(st.booleans()):
        recipient = None
    else:
        recipient = draw(st.sampled_from(RECIPIENTS[1:]))
    return Destination(name, exchange="ex", recipient=recipient, **attrs)


@st.composite
def wide(draw: st.DrawFn) -> Condition:
    """More topic probes than the compiled path takes: judged by ``evaluate`` itself."""
    members = [Destination(n, exchange="ex", pickup_within=_maybe_ms(draw, 0)) for n in NAMES]
    return DestinationSet(*members, process_within=_maybe_ms(draw, 0))


@st.composite
def conditions(draw: st.DrawFn) -> Condition:
    kind = draw(st.sampled_from(["tree", "tree", "tree", "wide"]))
    try:
        condition = draw(wide()) if kind == "wide" else draw(node(list(NAMES), 3, frozenset()))
        if draw(st.booleans()):
            window = condition.evaluation_window() + timedelta(
                milliseconds=draw(st.sampled_from(MS))
            )
            condition = _with_timeout(condition, window)
        condition.validate()
    except ConditionError:
        condition = Destination("q1", pickup_within=timedelta(seconds=1))
    return condition


def _with_timeout(node: Condition, timeout: timedelta) -> Condition:
    data = condition_to_dict(node)
    data["condition"]["evaluation_timeout_ms"] = timeout // timedelta(milliseconds=1)
    return condition_from_dict(data)


@st.composite
def histories(draw: st.DrawFn) -> dict[str, Any]:
    condition = draw(conditions())
    deadlines = [T0 + d for d in condition.deadlines()]
    deadlines.append(T0 + condition.evaluation_window())
    one_us = timedelta(microseconds=1)
    # Instants anywhere, and one microsecond around every deadline.
    instants = st.one_of(
        st.builds(lambda ms: T0 + timedelta(milliseconds=ms), st.integers(-500, 12000)),
        st.sampled_from(deadlines).flatmap(lambda d: st.sampled_from([d - one_us, d, d + one_us])),
    )
    acks: list[Ack] = []
    for _ in range(draw(st.integers(0, 8))):
        read = draw(instants)
        commit = None
        if draw(st.booleans()):
            commit = max(read, draw(instants))
        acks.append(
            Ack(
                destination=draw(st.sampled_from([*NAMES, "elsewhere"])),
                kind=AckKind.COMMIT if commit else AckKind.READ,
                read_at=read,
                committed_at=commit,
                recipient=draw(st.sampled_from(RECIPIENTS)),
            )
        )
    now = draw(instants)
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
    nows = spark.createDataFrame(
        [(f"cm{i}", h["now"]) for i, h in enumerate(batch)], "cm_id string, at timestamp"
    )
    cases = (
        cms.join(nows, "cm_id").select("cm_id", "condition_json", "sent_at", "at").localCheckpoint()
    )
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
    max_examples=10,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(batch=st.lists(histories(), min_size=25, max_size=40))
def test_spark_reevaluation_agrees_with_evaluate(spark: Any, batch: list[dict[str, Any]]) -> None:
    _check(spark, batch)


s1 = timedelta(seconds=1)
#: Hand-built conditions with every construct the compiled path handles (and one it
#: leaves to evaluate()), judged over seeded random histories below: the coverage does not
#: depend on what hypothesis happens to draw.
EXPLICIT: tuple[Condition, ...] = (
    Destination("q1", recipient="r1", pickup_within=s1, process_within=3 * s1),
    DestinationSet(
        Destination("q1", process_within=3 * s1),
        DestinationSet(
            Destination("q2"),
            Destination("q3"),
            Destination("q4"),
            process_within=5 * s1,
            min_process=2,
            max_process=2,
        ),
        pickup_within=2 * s1,
    ),
    DestinationSet(
        Destination("q1", exchange="ex", pickup_within=2 * s1, min_pickup=1, max_pickup=2),
        Destination("q2", exchange="ex", process_within=3 * s1, min_process=2),
        Destination("q3", exchange="ex", recipient="r2", pickup_within=s1),
        DestinationSet(Destination("q4"), Destination("q5", recipient="r1"), min_pickup=1),
        pickup_within=3 * s1,
        max_pickup=3,
    ),
    DestinationSet(
        DestinationSet(
            DestinationSet(Destination("q1"), Destination("q2"), min_pickup=1, max_pickup=1),
            Destination("q3", exchange="ex", min_pickup=0, max_pickup=1),
            max_pickup=1,
        ),
        pickup_within=2 * s1,
        process_within=5 * s1,
        evaluation_timeout=6 * s1,
    ),
    DestinationSet(
        *(Destination(n, exchange="ex", pickup_within=s1, process_within=2 * s1) for n in NAMES)
    ),
)


def _seeded_batch(seed: int) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    one_us = timedelta(microseconds=1)
    batch = []
    for condition in EXPLICIT:
        deadlines = [T0 + d for d in condition.deadlines()]
        deadlines.append(T0 + condition.evaluation_window())

        def instant(deadlines: list[datetime] = deadlines) -> datetime:
            if rng.random() < 0.5:
                return rng.choice(deadlines) + rng.choice([-one_us, timedelta(0), one_us])
            return T0 + timedelta(milliseconds=rng.randint(-500, 8000))

        for _ in range(12):
            acks = []
            for _ in range(rng.randint(0, 8)):
                read = instant()
                commit = max(read, instant()) if rng.random() < 0.5 else None
                acks.append(
                    Ack(
                        destination=rng.choice([*NAMES, "elsewhere"]),
                        kind=AckKind.COMMIT if commit else AckKind.READ,
                        read_at=read,
                        committed_at=commit,
                        recipient=rng.choice(RECIPIENTS),
                    )
                )
            batch.append({"condition": condition, "acks": acks, "now": instant()})
    return batch


def test_explicit_constructs_agree_with_evaluate(spark: Any) -> None:
    _check(spark, _seeded_batch(7) + _seeded_batch(8))


def test_explicit_conditions_cover_every_construct() -> None:
    plans = [plan_of(condition_to_json(c)) for c in EXPLICIT]
    assert {p.native for p in plans} == {True, False}
    skeletons = " ".join(p.skeleton for p in plans if p.native)
    for construct in (
        "queue(pickup,process)",
        "topic(pickup,min_pickup,max_pickup)",
        "topic(process,min_process)",
        "set(process,min_process,max_process)[queue(),queue(),queue()]",
        "set(min_pickup)",
        "set(max_pickup)[set(min_pickup,max_pickup)",
        "topic(min_pickup,max_pickup)",
    ):
        assert construct in skeletons, construct


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
