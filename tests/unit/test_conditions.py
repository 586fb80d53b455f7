"""Building conditions, and every way of building a bad one (DESIGN section 5).

Node-local rules are checked at construction, whole-tree rules in ``Condition.validate()``
(which ``evaluate`` and the codec call). Each error must name the node and the attribute.
"""

from __future__ import annotations

import re
from dataclasses import FrozenInstanceError
from datetime import datetime, timedelta, timezone

import pytest

from condmsg import (
    Ack,
    AckError,
    AckKind,
    Condition,
    ConditionError,
    CondmsgError,
    Delivery,
    Destination,
    DestinationSet,
    evaluate,
    evaluation_deadline,
)
from condmsg.core.condition_codec import condition_to_json
from tests.unit.strategies import SENT_AT
from tests.unit.vectors import DAY, EXAMPLE_1, SEC


def q(text: str) -> str:
    """A regex matching ``text`` literally."""
    return re.escape(text)


# -- valid trees -----------------------------------------------------------------------


def test_example_trees_build_and_validate() -> None:
    EXAMPLE_1.validate()
    Destination("qcentral", pickup_within=20 * SEC, evaluation_timeout=21 * SEC).validate()


def test_walk_paths_and_leaves() -> None:
    assert [(path, node.label) for path, node in EXAMPLE_1.walk()] == [
        ("root", "set{qr3,set{qr1,qr2,qr4}}"),
        ("root[0]", "'qr3'"),
        ("root[1]", "set{qr1,qr2,qr4}"),
        ("root[1][0]", "'qr1'"),
        ("root[1][1]", "'qr2'"),
        ("root[1][2]", "'qr4'"),
    ]
    assert [d.name for d in EXAMPLE_1.destinations()] == ["qr3", "qr1", "qr2", "qr4"]
    assert sorted(EXAMPLE_1.deadlines()) == [2 * DAY, 3 * DAY, 7 * DAY]


def test_evaluation_window_defaults_to_the_latest_deadline() -> None:
    assert EXAMPLE_1.evaluation_window() == 7 * DAY
    assert evaluation_deadline(EXAMPLE_1, SENT_AT) == SENT_AT + 7 * DAY
    explicit = Destination("q", pickup_within=20 * SEC, evaluation_timeout=21 * SEC)
    assert explicit.evaluation_window() == 21 * SEC
    # An evaluation timeout equal to the latest deadline cuts nothing off.
    Destination("q", pickup_within=20 * SEC, evaluation_timeout=20 * SEC).validate()


def test_required_and_topic_destinations() -> None:
    assert Destination("a", pickup_within=SEC).is_required
    assert Destination("a", process_within=SEC).is_required
    assert not Destination("a").is_required
    assert Destination("t", exchange="events").is_topic
    assert not Destination("a", recipient="alice").is_topic


def test_requires_processing_is_inherited_from_sets() -> None:
    assert EXAMPLE_1.requires_processing() == {"qr3": True, "qr1": True, "qr2": True, "qr4": True}
    pickup_only = DestinationSet(Destination("a"), Destination("b"), pickup_within=SEC)
    assert pickup_only.requires_processing() == {"a": False, "b": False}


def test_broker_properties_are_inherited_nearest_node_wins() -> None:
    tree = DestinationSet(
        Destination("a", priority=5),
        DestinationSet(Destination("b", persistent=True), Destination("c"), expiry=30 * SEC),
        pickup_within=SEC,
        priority=3,
        persistent=False,
        expiry=60 * SEC,
    )
    assert tree.delivery() == {
        "a": Delivery(expiry=60 * SEC, persistent=False, priority=5),
        "b": Delivery(expiry=30 * SEC, persistent=True, priority=3),
        "c": Delivery(expiry=30 * SEC, persistent=False, priority=3),
    }
    assert Destination("d", pickup_within=SEC).delivery() == {
        "d": Delivery(expiry=None, persistent=True, priority=0)
    }


def test_conditions_are_frozen_values() -> None:
    same = DestinationSet(
        Destination("qr3", process_within=3 * DAY),
        DestinationSet(
            Destination("qr1"),
            Destination("qr2"),
            Destination("qr4"),
            process_within=7 * DAY,
            min_process=2,
        ),
        pickup_within=2 * DAY,
    )
    assert same == EXAMPLE_1
    assert hash(same) == hash(EXAMPLE_1)
    assert DestinationSet(Destination("a"), pickup_within=SEC) != DestinationSet(
        Destination("a"), pickup_within=2 * SEC
    )
    with pytest.raises(FrozenInstanceError):
        EXAMPLE_1.pickup_within = SEC  # type: ignore[misc]
    with pytest.raises(FrozenInstanceError):
        EXAMPLE_1.members[0].name = "x"  # type: ignore[attr-defined]


def test_condition_itself_is_abstract() -> None:
    with pytest.raises(TypeError, match="abstract"):
        Condition(pickup_within=SEC)


def test_condition_error_is_a_condmsg_value_error() -> None:
    assert issubclass(ConditionError, CondmsgError)
    assert issubclass(ConditionError, ValueError)
    assert issubclass(AckError, CondmsgError)


# -- durations -------------------------------------------------------------------------

DURATIONS = ["pickup_within", "process_within", "expiry", "evaluation_timeout"]


@pytest.mark.parametrize("attribute", DURATIONS)
@pytest.mark.parametrize("bad", [timedelta(0), -SEC, -timedelta(microseconds=1)])
def test_zero_or_negative_durations_on_a_destination(attribute: str, bad: timedelta) -> None:
    with pytest.raises(ConditionError, match=rf"'q3': {attribute} must be positive"):
        Destination("q3", **{attribute: bad})  # type: ignore[arg-type]


@pytest.mark.parametrize("attribute", DURATIONS)
def test_zero_durations_on_a_set(attribute: str) -> None:
    with pytest.raises(ConditionError, match=q("set{a,b}: ") + rf"{attribute} must be positive"):
        DestinationSet(Destination("a"), Destination("b"), **{attribute: timedelta(0)})  # type: ignore[arg-type]


@pytest.mark.parametrize("attribute", DURATIONS)
@pytest.mark.parametrize(
    "bad", [timedelta(microseconds=1500), timedelta(seconds=20, microseconds=1)]
)
def test_durations_must_be_whole_milliseconds(attribute: str, bad: timedelta) -> None:
    with pytest.raises(ConditionError, match=rf"'q': {attribute} must be a whole number of milli"):
        Destination("q", **{attribute: bad})  # type: ignore[arg-type]


@pytest.mark.parametrize("attribute", DURATIONS)
@pytest.mark.parametrize("bad", [20, 20.0, "20s"])
def test_durations_must_be_timedeltas(attribute: str, bad: object) -> None:
    with pytest.raises(ConditionError, match=rf"'q': {attribute} must be a timedelta"):
        Destination("q", **{attribute: bad})  # type: ignore[arg-type]


# -- counts ----------------------------------------------------------------------------

COUNTS = ["min_pickup", "max_pickup", "min_process", "max_process"]


def _pair(**options: object) -> DestinationSet:
    return DestinationSet(
        Destination("a"),
        Destination("b"),
        pickup_within=SEC,
        process_within=SEC,
        **options,  # type: ignore[arg-type]
    )


@pytest.mark.parametrize("kind", ["pickup", "process"])
def test_min_greater_than_max(kind: str) -> None:
    with pytest.raises(
        ConditionError, match=q(f"set{{a,b}}: min_{kind} (2) is greater than max_{kind} (1)")
    ):
        _pair(**{f"min_{kind}": 2, f"max_{kind}": 1})


def test_min_greater_than_max_on_a_topic() -> None:
    with pytest.raises(ConditionError, match=q("'t': min_pickup (3) is greater than max_pickup")):
        Destination("t", exchange="e", pickup_within=SEC, min_pickup=3, max_pickup=2)


@pytest.mark.parametrize("attribute", COUNTS)
def test_count_larger_than_the_number_of_members(attribute: str) -> None:
    with pytest.raises(
        ConditionError,
        match=q(f"set{{a,b}}: {attribute} (3) is larger than the number of members (2)"),
    ):
        _pair(**{attribute: 3})


def test_count_equal_to_the_number_of_members_is_fine() -> None:
    _pair(min_pickup=2, max_process=2).validate()
    _pair(min_pickup=0, max_pickup=0).validate()


@pytest.mark.parametrize("attribute", COUNTS)
@pytest.mark.parametrize(
    ("bad", "problem"),
    [
        (-1, "must not be negative"),
        ("1", "must be an int"),
        (True, "must be an int"),
        (1.0, "must be an int"),
    ],
)
def test_bad_count_values(attribute: str, bad: object, problem: str) -> None:
    with pytest.raises(ConditionError, match=q(f"set{{a,b}}: {attribute} {problem}")):
        _pair(**{attribute: bad})


@pytest.mark.parametrize("attribute", COUNTS)
def test_counts_on_a_queue_destination(attribute: str) -> None:
    with pytest.raises(
        ConditionError, match=rf"'q': {attribute} is only allowed on a topic destination"
    ):
        Destination("q", pickup_within=SEC, process_within=SEC, **{attribute: 1})  # type: ignore[arg-type]


def test_counts_on_a_topic_with_a_named_recipient() -> None:
    with pytest.raises(ConditionError, match="'t': min_pickup cannot be combined with a named"):
        Destination("t", exchange="e", recipient="alice", pickup_within=SEC, min_pickup=1)


def test_counts_on_a_topic_are_allowed() -> None:
    Destination("t", exchange="e", pickup_within=SEC, min_pickup=5, max_pickup=9).validate()


@pytest.mark.parametrize(
    ("tree", "message"),
    [
        (
            DestinationSet(Destination("a"), Destination("b"), min_pickup=1, process_within=SEC),
            "root set{a,b}: min_pickup needs pickup_within",
        ),
        (
            DestinationSet(
                Destination("x", pickup_within=SEC),
                DestinationSet(Destination("a"), Destination("b"), max_process=1),
            ),
            "root[1] set{a,b}: max_process needs process_within",
        ),
        (
            DestinationSet(
                Destination("t", exchange="e", min_process=1), Destination("u"), pickup_within=SEC
            ),
            "root[0] 't': min_process needs process_within",
        ),
        (
            Destination("t", exchange="e", pickup_within=SEC, max_process=2),
            "root 't': max_process needs process_within",
        ),
    ],
    ids=["set", "nested set", "topic in a set", "topic root"],
)
def test_counts_without_a_deadline(tree: Condition, message: str) -> None:
    with pytest.raises(ConditionError, match=q(message)):
        tree.validate()
    # evaluate and the codec run the same whole-tree check.
    with pytest.raises(ConditionError, match=q(message)):
        evaluate(tree, SENT_AT, [], SENT_AT)
    with pytest.raises(ConditionError, match=q(message)):
        condition_to_json(tree)


def test_a_deadline_on_an_enclosing_set_covers_a_count() -> None:
    DestinationSet(
        DestinationSet(Destination("a"), Destination("b"), min_process=1),
        Destination("t", exchange="e", min_process=1),
        process_within=SEC,
    ).validate()


# -- sets and names --------------------------------------------------------------------


def test_empty_set() -> None:
    with pytest.raises(ConditionError, match="members must not be empty"):
        DestinationSet(pickup_within=SEC)


def test_set_members_must_be_conditions() -> None:
    with pytest.raises(ConditionError, match=q("set member [1] must be a Destination")):
        DestinationSet(Destination("a"), "b", pickup_within=SEC)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "build",
    [
        lambda: DestinationSet(Destination("a"), Destination("a"), pickup_within=SEC),
        lambda: DestinationSet(
            Destination("a"), DestinationSet(Destination("b"), Destination("a")), pickup_within=SEC
        ),
        lambda: DestinationSet(
            Destination("a", exchange="e"), Destination("a", recipient="r"), pickup_within=SEC
        ),
    ],
    ids=["siblings", "nested", "topic and queue"],
)
def test_the_same_destination_twice(build) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ConditionError, match="destination 'a' appears twice"):
        build()


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"name": ""}, "name must not be empty"),
        ({"name": "   "}, "name must not be empty"),
        ({"name": "x" * 256}, "name is longer than 255 bytes"),
        ({"name": 42}, "name must be a str"),
        ({"name": "q", "recipient": ""}, "'q': recipient must not be empty"),
        ({"name": "q", "exchange": 7}, "'q': exchange must be a str"),
        ({"name": "q", "routing_key": "rk"}, "'q': routing_key needs an exchange"),
    ],
)
def test_bad_names(options: dict[str, object], message: str) -> None:
    name = options.pop("name")
    with pytest.raises(ConditionError, match=q(message)):
        Destination(name, pickup_within=SEC, **options)  # type: ignore[arg-type]


def test_a_name_of_255_bytes_is_fine() -> None:
    Destination("x" * 255, pickup_within=SEC).validate()


# -- broker properties -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"priority": 10}, "'q': priority must be between 0 and 9, got 10"),
        ({"priority": -1}, "'q': priority must be between 0 and 9, got -1"),
        ({"priority": True}, "'q': priority must be an int"),
        ({"priority": 1.5}, "'q': priority must be an int"),
        ({"persistent": "yes"}, "'q': persistent must be a bool"),
        ({"persistent": 1}, "'q': persistent must be a bool"),
    ],
)
def test_bad_broker_properties(options: dict[str, object], message: str) -> None:
    with pytest.raises(ConditionError, match=q(message)):
        Destination("q", pickup_within=SEC, **options)  # type: ignore[arg-type]


def test_priority_bounds_are_inclusive() -> None:
    Destination("q", pickup_within=SEC, priority=0).validate()
    Destination("q", pickup_within=SEC, priority=9).validate()


# -- time constraints and the evaluation timeout ---------------------------------------


@pytest.mark.parametrize(
    "tree",
    [
        DestinationSet(Destination("a"), Destination("b")),
        DestinationSet(Destination("a", expiry=SEC), Destination("b"), priority=3),
        Destination("a"),
    ],
    ids=["set", "set with broker properties", "destination"],
)
def test_a_tree_with_no_time_constraint(tree: Condition) -> None:
    message = f"root {tree.label}: no pickup_within or process_within anywhere in the tree"
    with pytest.raises(ConditionError, match=q(message)):
        tree.validate()
    with pytest.raises(ConditionError, match=q(message)):
        evaluate(tree, SENT_AT, [], SENT_AT)
    with pytest.raises(ConditionError, match=q(message)):
        condition_to_json(tree)


@pytest.mark.parametrize(
    ("build", "node"),
    [
        (
            lambda: DestinationSet(
                Destination("a", pickup_within=SEC, evaluation_timeout=2 * SEC), Destination("b")
            ),
            "'a'",
        ),
        (
            lambda: DestinationSet(
                DestinationSet(Destination("a"), pickup_within=SEC, evaluation_timeout=2 * SEC),
                Destination("b"),
            ),
            "set{a}",
        ),
        (
            lambda: DestinationSet(
                Destination("x"),
                DestinationSet(
                    Destination("a"),
                    Destination("b", pickup_within=SEC, evaluation_timeout=2 * SEC),
                ),
            ),
            "'b'",
        ),
    ],
    ids=["destination", "set", "two levels down"],
)
def test_evaluation_timeout_on_a_nested_node(build, node: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(
        ConditionError,
        match=q(node) + r".*evaluation_timeout is only allowed on the root",
    ):
        build()


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (
            lambda: Destination("q", pickup_within=20 * SEC, evaluation_timeout=19 * SEC),
            "'q': evaluation_timeout (19s) is shorter than a deadline it would cut off (20s)",
        ),
        (
            lambda: DestinationSet(
                Destination("a", process_within=30 * SEC),
                Destination("b"),
                pickup_within=10 * SEC,
                evaluation_timeout=20 * SEC,
            ),
            "set{a,b}: evaluation_timeout (20s) is shorter than a deadline it would cut off (30s)",
        ),
        (
            lambda: DestinationSet(Destination("a"), pickup_within=2 * DAY, evaluation_timeout=DAY),
            "set{a}: evaluation_timeout (1d) is shorter",
        ),
    ],
    ids=["destination", "member deadline", "days"],
)
def test_evaluation_timeout_shorter_than_a_deadline(build, message: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ConditionError, match=q(message)):
        build()


# -- naive datetimes and other bad arguments -------------------------------------------

NAIVE = datetime(2024, 3, 4, 9, 0)
EXAMPLE_2 = Destination("qcentral", pickup_within=20 * SEC, evaluation_timeout=21 * SEC)


def test_evaluate_rejects_a_naive_sent_at() -> None:
    with pytest.raises(ConditionError, match="sent_at is a naive datetime"):
        evaluate(EXAMPLE_2, NAIVE, [], SENT_AT)
    with pytest.raises(ConditionError, match="sent_at is a naive datetime"):
        evaluation_deadline(EXAMPLE_2, NAIVE)


def test_evaluate_rejects_a_naive_now() -> None:
    with pytest.raises(ConditionError, match="now is a naive datetime"):
        evaluate(EXAMPLE_2, SENT_AT, [], NAIVE)


@pytest.mark.parametrize("bad", ["2024-03-04T09:00:00Z", 1709542800, None])
def test_evaluate_rejects_non_datetimes(bad: object) -> None:
    with pytest.raises(ConditionError, match="sent_at must be a datetime"):
        evaluate(EXAMPLE_2, bad, [], SENT_AT)  # type: ignore[arg-type]
    with pytest.raises(ConditionError, match="now must be a datetime"):
        evaluate(EXAMPLE_2, SENT_AT, [], bad)  # type: ignore[arg-type]


def test_evaluate_rejects_things_that_are_not_conditions_or_acks() -> None:
    with pytest.raises(ConditionError, match="condition must be a Condition, got dict"):
        evaluate({"type": "destination"}, SENT_AT, [], SENT_AT)  # type: ignore[arg-type]
    with pytest.raises(ConditionError, match="acks must be Ack, got dict"):
        evaluate(EXAMPLE_2, SENT_AT, [{"destination": "qcentral"}], SENT_AT)  # type: ignore[list-item]


def test_an_ack_rejects_a_naive_read_at() -> None:
    with pytest.raises(AckError, match="'qcentral': read_at is a naive datetime"):
        Ack(destination="qcentral", kind=AckKind.READ, read_at=NAIVE)


def test_an_ack_rejects_a_naive_committed_at() -> None:
    with pytest.raises(AckError, match="'qcentral': committed_at is a naive datetime"):
        Ack(destination="qcentral", kind=AckKind.COMMIT, read_at=SENT_AT, committed_at=NAIVE)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"kind": AckKind.COMMIT}, "a COMMIT ack needs committed_at"),
        ({"kind": AckKind.READ, "committed_at": SENT_AT}, "a READ ack has no committed_at"),
        (
            {"kind": AckKind.COMMIT, "committed_at": SENT_AT - timedelta(microseconds=1)},
            "committed_at is before read_at",
        ),
        ({"kind": "peek"}, "kind must be 'read' or 'commit'"),
        ({"kind": AckKind.READ, "recipient": ""}, "recipient must be a non-empty str"),
        ({"kind": AckKind.READ, "destination": ""}, "destination must be a non-empty str"),
        ({"kind": AckKind.READ, "read_at": "2024-03-04"}, "read_at must be a datetime"),
    ],
)
def test_bad_acks(options: dict[str, object], message: str) -> None:
    fields: dict[str, object] = {"destination": "q", "read_at": SENT_AT, **options}
    with pytest.raises(AckError, match=q(message)):
        Ack(**fields)  # type: ignore[arg-type]


def test_acks_normalise_to_utc() -> None:
    plus_two = timezone(timedelta(hours=2))
    ack = Ack(
        destination="q",
        kind="commit",  # type: ignore[arg-type]
        read_at=datetime(2024, 3, 4, 11, 0, tzinfo=plus_two),
        committed_at=datetime(2024, 3, 4, 11, 0, 1, tzinfo=plus_two),
    )
    assert ack.kind is AckKind.COMMIT
    assert ack.read_at == SENT_AT
    assert ack.read_at.utcoffset() == timedelta(0)
    assert ack.committed_at == SENT_AT + SEC
