"""The versioned JSON codec of condition trees.

Document: ``{"schema": 1, "condition": {...}}``; nodes carry ``type`` ("destination" or
"set"), durations as integer ``*_ms``; unset attributes are omitted. Bad documents raise
``ConditionError`` naming the node's path (``root[1][0]``) and the field.
"""

from __future__ import annotations

import copy
import json
import re
from datetime import timedelta
from typing import Any

import pytest

from condmsg import Condition, ConditionError, Destination, DestinationSet
from condmsg.core.condition_codec import (
    condition_from_dict,
    condition_from_json,
    condition_to_dict,
    condition_to_json,
)
from tests.unit.vectors import DAY, EXAMPLE_1, SEC

EXAMPLE_1_DOCUMENT: dict[str, Any] = {
    "schema": 1,
    "condition": {
        "type": "set",
        "pickup_within_ms": 172_800_000,
        "members": [
            {"type": "destination", "name": "qr3", "process_within_ms": 259_200_000},
            {
                "type": "set",
                "process_within_ms": 604_800_000,
                "min_process": 2,
                "members": [
                    {"type": "destination", "name": "qr1"},
                    {"type": "destination", "name": "qr2"},
                    {"type": "destination", "name": "qr4"},
                ],
            },
        ],
    },
}

EXAMPLE_2 = Destination("qcentral", pickup_within=20 * SEC, evaluation_timeout=21 * SEC)
EXAMPLE_2_DOCUMENT = {
    "schema": 1,
    "condition": {
        "type": "destination",
        "name": "qcentral",
        "pickup_within_ms": 20_000,
        "evaluation_timeout_ms": 21_000,
    },
}

EVERY_ATTRIBUTE = DestinationSet(
    Destination(
        "news",
        exchange="events",
        routing_key="news.flights",
        pickup_within=5 * SEC,
        min_pickup=0,
        max_pickup=7,
        priority=0,
        persistent=False,
    ),
    Destination("inbox", recipient="alice", process_within=timedelta(milliseconds=1500)),
    DestinationSet(Destination("x", expiry=timedelta(milliseconds=1)), Destination("y")),
    pickup_within=10 * SEC,
    min_pickup=1,
    max_pickup=3,
    min_process=0,
    max_process=1,
    process_within=2 * SEC,
    expiry=DAY,
    persistent=True,
    priority=9,
    evaluation_timeout=30 * SEC,
)


def match(text: str) -> str:
    return re.escape(text)


def decode(document: object) -> Condition:
    return condition_from_json(json.dumps(document))


# -- encoding ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("condition", "document"),
    [(EXAMPLE_1, EXAMPLE_1_DOCUMENT), (EXAMPLE_2, EXAMPLE_2_DOCUMENT)],
    ids=["example 1", "example 2"],
)
def test_the_paper_examples_as_documents(condition: Condition, document: dict[str, Any]) -> None:
    assert condition_to_dict(condition) == document
    assert json.loads(condition_to_json(condition)) == document
    assert condition_from_dict(document) == condition
    assert decode(document) == condition


def test_json_text_is_compact_and_deterministic() -> None:
    text = condition_to_json(EXAMPLE_2)
    assert text == (
        '{"condition":{"evaluation_timeout_ms":21000,"name":"qcentral",'
        '"pickup_within_ms":20000,"type":"destination"},"schema":1}'
    )


def test_every_attribute_round_trips_including_zero_and_false() -> None:
    document = condition_to_dict(EVERY_ATTRIBUTE)
    news = document["condition"]["members"][0]
    assert news["min_pickup"] == 0
    assert news["priority"] == 0
    assert news["persistent"] is False
    assert news["exchange"] == "events"
    assert news["routing_key"] == "news.flights"
    assert document["condition"]["members"][1]["process_within_ms"] == 1500
    assert document["condition"]["members"][2]["members"][0]["expiry_ms"] == 1
    assert condition_from_json(condition_to_json(EVERY_ATTRIBUTE)) == EVERY_ATTRIBUTE
    assert condition_from_json(condition_to_json(EVERY_ATTRIBUTE).encode()) == EVERY_ATTRIBUTE


def test_unset_attributes_are_omitted() -> None:
    node = condition_to_dict(EXAMPLE_1)["condition"]["members"][1]["members"][0]
    assert node == {"type": "destination", "name": "qr1"}


# -- decoding errors --------------------------------------------------------------------


def broken(change) -> dict[str, Any]:  # type: ignore[no-untyped-def]
    """A deep copy of Example 1's document, changed in place by ``change``."""
    document = copy.deepcopy(EXAMPLE_1_DOCUMENT)
    change(document)
    return document


def node(document: dict[str, Any], *path: int) -> dict[str, Any]:
    found = document["condition"]
    for index in path:
        found = found["members"][index]
    return found  # type: ignore[no-any-return]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{", "condition JSON: not valid JSON"),
        (b"\xff\xfe{", "condition JSON: not valid JSON"),
        ("[]", "condition JSON: the document must be an object"),
        ('"set"', "condition JSON: the document must be an object"),
    ],
)
def test_not_a_document(text: str | bytes, message: str) -> None:
    with pytest.raises(ConditionError, match=match(message)):
        condition_from_json(text)


@pytest.mark.parametrize(
    ("document", "message"),
    [
        ({"condition": EXAMPLE_2_DOCUMENT["condition"]}, "missing schema version ('schema')"),
        ({**EXAMPLE_2_DOCUMENT, "schema": "1"}, "schema must be an int, got '1'"),
        ({**EXAMPLE_2_DOCUMENT, "schema": True}, "schema must be an int, got True"),
        ({**EXAMPLE_2_DOCUMENT, "schema": 1.0}, "schema must be an int, got 1.0"),
        ({**EXAMPLE_2_DOCUMENT, "schema": 2}, "unsupported schema version 2"),
        ({"schema": 1}, "missing 'condition'"),
        ({**EXAMPLE_2_DOCUMENT, "sender": "me"}, "unknown field(s) ['sender']"),
    ],
    ids=[
        "no schema",
        "str schema",
        "bool schema",
        "float schema",
        "schema 2",
        "no condition",
        "extra",
    ],
)
def test_bad_envelope(document: dict[str, Any], message: str) -> None:
    with pytest.raises(ConditionError, match=match(f"condition JSON: {message}")):
        decode(document)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        # unknown fields, at every depth, named with the node's path
        (lambda d: node(d).update(colour="red"), "root: unknown field(s) ['colour']"),
        (lambda d: node(d, 1).update(name="destSet1"), "root[1]: unknown field(s) ['name']"),
        (lambda d: node(d, 1, 0).update(queue="x"), "root[1][0]: unknown field(s) ['queue']"),
        (lambda d: node(d, 0).update(members=[]), "root[0]: unknown field(s) ['members']"),
        (
            lambda d: node(d, 0).update(pickup_within=5),
            "root[0]: unknown field(s) ['pickup_within']",
        ),
        # wrong types
        (
            lambda d: node(d, 0).update(process_within_ms="259200000"),
            "root[0]: process_within_ms must be an integer, got '259200000'",
        ),
        (
            lambda d: node(d, 0).update(process_within_ms=1500.5),
            "root[0]: process_within_ms must be an integer",
        ),
        (
            lambda d: node(d, 0).update(process_within_ms=259200000.0),
            "root[0]: process_within_ms must be an integer",
        ),
        (
            lambda d: node(d).update(pickup_within_ms=True),
            "root: pickup_within_ms must be an integer, got True",
        ),
        (
            lambda d: node(d, 1).update(min_process="2"),
            "root[1]: min_process must be an integer, got '2'",
        ),
        (lambda d: node(d, 1, 2).update(priority=None), "root[1][2]: priority must be an integer"),
        (lambda d: node(d, 1, 1).update(name=42), "root[1][1]: name must be a string"),
        (lambda d: node(d, 0).update(recipient=["a"]), "root[0]: recipient must be a string"),
        (lambda d: node(d).update(persistent="yes"), "root: persistent must be a boolean"),
        (lambda d: node(d).update(persistent=1), "root: persistent must be a boolean"),
        (lambda d: node(d, 1).update(members="qr1"), "root[1]: members must be a list"),
        (lambda d: node(d, 1)["members"].append("qr5"), "root[1][3]: a node must be an object"),
        # type and name
        (lambda d: node(d, 1).pop("type"), "root[1]: type must be 'destination' or 'set'"),
        (lambda d: node(d, 1, 0).update(type="queue"), "root[1][0]: type must be 'destination'"),
        (lambda d: node(d, 1, 0).pop("name"), "root[1][0]: a destination needs 'name'"),
    ],
)
def test_bad_nodes_name_the_path_and_the_field(change, message: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ConditionError, match=match(message)):
        decode(broken(change))


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            lambda d: node(d, 1, 2).update(pickup_within_ms=0),
            "root[1][2] 'qr4': pickup_within must be positive",
        ),
        (
            lambda d: node(d, 0).update(process_within_ms=-1000),
            "root[0] 'qr3': process_within must be positive",
        ),
        (
            lambda d: node(d, 1).update(process_within_ms=0),
            "root[1] set{qr1,qr2,qr4}: process_within must be positive",
        ),
        (
            lambda d: node(d, 1).update(min_process=4),
            "root[1] set{qr1,qr2,qr4}: min_process (4) is larger than the number of members (3)",
        ),
        (
            lambda d: node(d, 1).update(max_process=1),
            "root[1] set{qr1,qr2,qr4}: min_process (2) is greater than max_process (1)",
        ),
        (lambda d: node(d, 1).update(members=[]), "root[1] set{}: members must not be empty"),
        (
            lambda d: node(d, 1, 1).update(name="qr1"),
            "destination 'qr1' appears twice",
        ),
        (
            lambda d: node(d, 0).update(min_pickup=1),
            "root[0] 'qr3': min_pickup is only allowed on a topic destination",
        ),
        (
            lambda d: node(d, 0).update(priority=10),
            "root[0] 'qr3': priority must be between 0 and 9",
        ),
        (
            lambda d: node(d, 1, 0).update(routing_key="rk"),
            "root[1][0] 'qr1': routing_key needs an exchange",
        ),
        (
            lambda d: node(d).update(evaluation_timeout_ms=86_400_000),
            "root set{qr3,set{qr1,qr2,qr4}}: evaluation_timeout (1d) is shorter than a "
            "deadline it would cut off (7d)",
        ),
    ],
)
def test_bad_values_in_documents(change, message: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ConditionError, match=match(message)):
        decode(broken(change))


def test_evaluation_timeout_on_a_nested_node_in_a_document() -> None:
    document = broken(lambda d: node(d, 1, 0).update(evaluation_timeout_ms=1000))
    with pytest.raises(
        ConditionError, match=r"'qr1'.*evaluation_timeout is only allowed on the root"
    ):
        decode(document)


def test_whole_tree_rules_are_checked_on_decode() -> None:
    no_time = {"schema": 1, "condition": {"type": "destination", "name": "q"}}
    with pytest.raises(
        ConditionError, match=match("root 'q': no pickup_within or process_within anywhere")
    ):
        decode(no_time)
    no_deadline = broken(lambda d: node(d, 1).pop("process_within_ms"))
    with pytest.raises(
        ConditionError,
        match=match("root[1] set{qr1,qr2,qr4}: min_process needs process_within"),
    ):
        decode(no_deadline)


def test_encoding_validates_the_tree_first() -> None:
    with pytest.raises(ConditionError, match="no pickup_within or process_within"):
        condition_to_json(DestinationSet(Destination("a"), Destination("b")))
