"""The condition model: ``Condition`` (base), ``Destination`` (leaf), ``DestinationSet``.

The classes follow the Composite pattern of the paper's Figure 3. They are frozen value
objects: a condition is built once, validated once, and shared by the sender, the
evaluator, the receiver and the Spark audit. This module is pure: it imports no I/O
library.

Attributes (all optional, keyword-only):

``pickup_within`` / ``process_within``
    Durations (``timedelta``, whole milliseconds) relative to the CM's ``sent_at``. On a
    ``Destination`` they make it a *required* destination; on a ``DestinationSet`` they apply
    to every member unless the set also gives ``min_*``/``max_*`` counts for that kind.
``min_pickup`` / ``max_pickup`` / ``min_process`` / ``max_process``
    Counts of members (on a set) or of distinct recipients (on a pub/sub ``Destination``
    whose final recipients are anonymous) that must / may pick up or process in time.
``expiry`` / ``persistent`` / ``priority``
    Broker properties of the copies (AMQP expiration, delivery mode, priority 0-9); a value
    set on a set is the default for its members, the nearest node wins.
``evaluation_timeout``
    Root only: when no more acks are awaited. Defaults to the latest deadline in the tree.

Validation that needs only the node itself happens at construction; what needs the whole
tree (a time constraint somewhere, a deadline for every count) happens in
:meth:`Condition.validate`, which ``evaluate``, the JSON codec and the sender call.

The JSON document of a tree is :mod:`condmsg.core.condition_codec`'s (``condition_to_json``,
``condition_from_json``): the codec builds these classes, so the model does not know it.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field, fields
from datetime import timedelta
from enum import StrEnum
from typing import Any, ClassVar

from condmsg.core.errors import ConditionError
from condmsg.core.limits import forbidden_character
from condmsg.core.timeutil import describe_duration, is_whole_ms

#: Highest priority an application may give a copy. Compensations travel above it.
MAX_APP_PRIORITY = 9
#: Priority of compensations, so that they usually overtake an unread original.
COMPENSATION_PRIORITY = 10
#: ``x-max-priority`` of the queues condmsg declares.
QUEUE_MAX_PRIORITY = COMPENSATION_PRIORITY
#: AMQP short strings (queue and exchange names) are at most 255 bytes.
MAX_NAME_BYTES = 255
#: Longest duration of any attribute (100 years of 365.25 days): longer ones are no
#: deadline anyone waits for, and past it dates overflow (Python stops at year 9999).
MAX_DURATION = timedelta(days=36525)
#: Largest count (``min_*``/``max_*``): a signed 32-bit integer, as every store and
#: language that reads the condition JSON holds it.
MAX_COUNT = 2**31 - 1
#: Deepest tree (levels, the root is 1) and most nodes (sets and destinations): bounds
#: on what a sender stores and every decoder then walks.
MAX_DEPTH = 32
MAX_NODES = 1000


class Kind(StrEnum):
    """The two kinds of constraint a node can carry."""

    PICKUP = "pickup"
    PROCESS = "process"


_DURATION_FIELDS = ("pickup_within", "process_within", "expiry", "evaluation_timeout")
_COUNT_FIELDS = ("min_pickup", "max_pickup", "min_process", "max_process")


@dataclass(frozen=True, slots=True, kw_only=True)
class Delivery:
    """Broker properties resolved for one destination (nearest node wins)."""

    expiry: timedelta | None
    persistent: bool
    priority: int


@dataclass(frozen=True, slots=True, kw_only=True, repr=False)
class Condition:
    """Base of the composite. Not instantiated directly."""

    pickup_within: timedelta | None = None
    process_within: timedelta | None = None
    min_pickup: int | None = None
    max_pickup: int | None = None
    min_process: int | None = None
    max_process: int | None = None
    expiry: timedelta | None = None
    persistent: bool | None = None
    priority: int | None = None
    evaluation_timeout: timedelta | None = None

    members: ClassVar[tuple[Condition, ...]] = ()

    def __post_init__(self) -> None:
        if type(self) is Condition:
            raise TypeError("Condition is abstract: build a Destination or a DestinationSet")
        self._check_attributes()

    def __repr__(self) -> str:
        """Only the attributes that are set: ``Destination('qr3', process_within=3 days)``."""
        parts = [repr(m) for m in self.members]
        if isinstance(self, Destination):
            parts.insert(0, repr(self.name))
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name not in ("name", "members") and value is not None:
                parts.append(f"{f.name}={value!r}")
        return f"{type(self).__name__}({', '.join(parts)})"

    # -- the composite interface ------------------------------------------------------

    @property
    def label(self) -> str:
        """A short human name for messages: ``'qr3'`` or ``set{qr1,qr2}``."""
        raise NotImplementedError

    def within(self, kind: Kind) -> timedelta | None:
        return self.pickup_within if kind is Kind.PICKUP else self.process_within

    def min_count(self, kind: Kind) -> int | None:
        return self.min_pickup if kind is Kind.PICKUP else self.min_process

    def max_count(self, kind: Kind) -> int | None:
        return self.max_pickup if kind is Kind.PICKUP else self.max_process

    def has_counts(self, kind: Kind) -> bool:
        return self.min_count(kind) is not None or self.max_count(kind) is not None

    def walk(self, path: str = "root") -> Iterator[tuple[str, Condition]]:
        """Every node of the tree, depth first, with its path (``root[1][0]``)."""
        yield path, self
        for index, member in enumerate(self.members):
            yield from member.walk(f"{path}[{index}]")

    def destinations(self) -> tuple[Destination, ...]:
        """The leaves, depth first."""
        return tuple(node for _, node in self.walk() if isinstance(node, Destination))

    def deadlines(self) -> tuple[timedelta, ...]:
        """Every pickup and processing duration in the tree."""
        found: list[timedelta] = []
        for _, node in self.walk():
            found.extend(d for d in (node.pickup_within, node.process_within) if d is not None)
        return tuple(found)

    def evaluation_window(self) -> timedelta:
        """``evaluation_timeout``, or by default the latest deadline in the tree."""
        if self.evaluation_timeout is not None:
            return self.evaluation_timeout
        deadlines = self.deadlines()
        if not deadlines:
            raise ConditionError(f"root {self.label}: the tree has no time constraint")
        return max(deadlines)

    def delivery(self) -> dict[str, Delivery]:
        """Broker properties per destination name, inheriting from enclosing sets."""
        resolved: dict[str, Delivery] = {}

        def visit(node: Condition, inherited: Delivery) -> None:
            here = Delivery(
                expiry=node.expiry if node.expiry is not None else inherited.expiry,
                persistent=node.persistent if node.persistent is not None else inherited.persistent,
                priority=node.priority if node.priority is not None else inherited.priority,
            )
            if isinstance(node, Destination):
                resolved[node.name] = here
            for member in node.members:
                visit(member, here)

        visit(self, Delivery(expiry=None, persistent=True, priority=0))
        return resolved

    def requires_processing(self) -> dict[str, bool]:
        """Per destination name: does a processing constraint cover it (itself or a set)?"""
        result: dict[str, bool] = {}

        def visit(node: Condition, covered: bool) -> None:
            covered = covered or node.process_within is not None
            if isinstance(node, Destination):
                result[node.name] = covered
            for member in node.members:
                visit(member, covered)

        visit(self, False)
        return result

    # -- validation -----------------------------------------------------------------

    def validate(self) -> None:
        """Check the rules that need the whole tree, with this node as the root.

        Raises :class:`ConditionError` naming the node by its path and the attribute.
        """
        if not self.deadlines():
            raise ConditionError(
                f"root {self.label}: no pickup_within or process_within anywhere in the tree "
                "(a condition needs at least one time constraint)"
            )
        self._check_counts_have_deadlines("root", covered=frozenset())

    def _check_counts_have_deadlines(self, path: str, covered: frozenset[Kind]) -> None:
        here = set(covered)
        for kind in Kind:
            if self.within(kind) is not None:
                here.add(kind)
        for kind in Kind:
            if self.has_counts(kind) and kind not in here:
                attr = f"min_{kind}" if self.min_count(kind) is not None else f"max_{kind}"
                raise ConditionError(
                    f"{path} {self.label}: {attr} needs {kind}_within on this node or on an "
                    "enclosing set (a count needs a deadline)"
                )
        for index, member in enumerate(self.members):
            member._check_counts_have_deadlines(f"{path}[{index}]", frozenset(here))

    def _fail(self, attribute: str, problem: str) -> ConditionError:
        return ConditionError(f"{self.label}: {attribute} {problem}")

    def _check_attributes(self) -> None:
        for name in _DURATION_FIELDS:
            value = getattr(self, name)
            if value is None:
                continue
            if not isinstance(value, timedelta):
                raise self._fail(name, f"must be a timedelta, got {type(value).__name__}")
            if value <= timedelta(0):
                # In the milliseconds documents give (a timedelta prints -5 s as "-1 day,
                # 23:59:55").
                raise self._fail(name, f"must be positive, got {value / _ONE_MS:g} ms")
            if not is_whole_ms(value):
                raise self._fail(name, f"must be a whole number of milliseconds, got {value}")
            if value > MAX_DURATION:
                raise self._fail(name, f"must be at most {MAX_DURATION.days} days, got {value}")
        for name in _COUNT_FIELDS:
            value = getattr(self, name)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int):
                raise self._fail(name, f"must be an int, got {type(value).__name__}")
            if value < 0:
                raise self._fail(name, f"must not be negative, got {value}")
            if value > MAX_COUNT:
                raise self._fail(name, f"must be at most {MAX_COUNT}")
        for kind in Kind:
            low, high = self.min_count(kind), self.max_count(kind)
            if low is not None and high is not None and low > high:
                raise self._fail(f"min_{kind}", f"({low}) is greater than max_{kind} ({high})")
        if self.persistent is not None and not isinstance(self.persistent, bool):
            raise self._fail("persistent", f"must be a bool, got {type(self.persistent).__name__}")
        if self.priority is not None:
            if isinstance(self.priority, bool) or not isinstance(self.priority, int):
                raise self._fail("priority", f"must be an int, got {type(self.priority).__name__}")
            if not 0 <= self.priority <= MAX_APP_PRIORITY:
                raise self._fail(
                    "priority", f"must be between 0 and {MAX_APP_PRIORITY}, got {self.priority}"
                )
        if self.evaluation_timeout is not None:
            latest = max(self.deadlines(), default=None)
            if latest is not None and self.evaluation_timeout < latest:
                raise self._fail(
                    "evaluation_timeout",
                    f"({describe_duration(self.evaluation_timeout)}) is shorter than a deadline "
                    f"it would cut off ({describe_duration(latest)})",
                )


def _check_name(
    owner: str, attribute: str, value: object, *, optional: bool, empty: bool = False
) -> None:
    """A queue, exchange, routing key or recipient name: an AMQP short string that the
    store's columns and the tokens' recipe can hold (see :mod:`condmsg.core.limits`)."""
    if value is None and optional:
        return
    if not isinstance(value, str):
        raise ConditionError(f"{owner}: {attribute} must be a str, got {type(value).__name__}")
    if not empty and not value.strip():
        raise ConditionError(f"{owner}: {attribute} must not be empty")
    bad = forbidden_character(value)  # before encode(): a lone surrogate does not encode
    if bad is not None:
        raise ConditionError(f"{owner}: {attribute} contains {bad}")
    if len(value.encode()) > MAX_NAME_BYTES:
        raise ConditionError(f"{owner}: {attribute} is longer than {MAX_NAME_BYTES} bytes")


@dataclass(frozen=True, slots=True, kw_only=True, repr=False)
class Destination(Condition):
    """A leaf: one queue, or one pub/sub topic (``exchange`` + ``routing_key``).

    ``name`` is the queue name for a queue destination; for a topic destination it names
    the destination in the condition and in acks, and ``routing_key`` defaults to it. A
    topic destination's recipients are anonymous: counts on it count distinct recipient
    identities that acked. ``recipient`` restricts the acks that count to one identity.
    """

    name: str = field(kw_only=False)
    recipient: str | None = None
    exchange: str | None = None
    routing_key: str | None = None

    def __post_init__(self) -> None:
        _check_name(f"destination {_shown(self.name)}", "name", self.name, optional=False)
        _check_name(self.label, "recipient", self.recipient, optional=True)
        _check_name(self.label, "exchange", self.exchange, optional=True)
        if self.routing_key is not None:
            if self.exchange is None:
                raise self._fail("routing_key", "needs an exchange (a topic destination)")
            _check_name(self.label, "routing_key", self.routing_key, optional=True, empty=True)
        Condition.__post_init__(self)
        for kind in Kind:
            if not self.has_counts(kind):
                continue
            attr = f"min_{kind}" if self.min_count(kind) is not None else f"max_{kind}"
            if not self.is_topic:
                raise self._fail(
                    attr,
                    "is only allowed on a topic destination (exchange=...), whose recipients "
                    "are anonymous; a queue copy is consumed once",
                )
            if self.recipient is not None:
                raise self._fail(attr, "cannot be combined with a named recipient")

    @property
    def label(self) -> str:
        return repr(self.name)

    @property
    def is_topic(self) -> bool:
        """True when the copy goes to an exchange and its recipients are anonymous."""
        return self.exchange is not None

    @property
    def is_required(self) -> bool:
        """A destination with a time constraint of its own must ack; others are optional."""
        return self.pickup_within is not None or self.process_within is not None


@dataclass(frozen=True, slots=True, kw_only=True, init=False, repr=False)
class DestinationSet(Condition):
    """A composite: conditions that apply to a set of destinations and nested sets."""

    members: tuple[Condition, ...]  # type: ignore[misc]

    def __init__(
        self,
        *members: Condition,
        pickup_within: timedelta | None = None,
        process_within: timedelta | None = None,
        min_pickup: int | None = None,
        max_pickup: int | None = None,
        min_process: int | None = None,
        max_process: int | None = None,
        expiry: timedelta | None = None,
        persistent: bool | None = None,
        priority: int | None = None,
        evaluation_timeout: timedelta | None = None,
    ) -> None:
        object.__setattr__(self, "members", tuple(members))
        values: dict[str, Any] = {
            "pickup_within": pickup_within,
            "process_within": process_within,
            "min_pickup": min_pickup,
            "max_pickup": max_pickup,
            "min_process": min_process,
            "max_process": max_process,
            "expiry": expiry,
            "persistent": persistent,
            "priority": priority,
            "evaluation_timeout": evaluation_timeout,
        }
        for name, value in values.items():
            object.__setattr__(self, name, value)
        self.__post_init__()

    def __post_init__(self) -> None:
        for index, member in enumerate(self.members):
            if not isinstance(member, Condition):
                raise ConditionError(
                    f"set member [{index}] must be a Destination or DestinationSet, "
                    f"got {type(member).__name__}"
                )
        if not self.members:
            raise ConditionError("set{}: members must not be empty (an empty DestinationSet)")
        _check_size(self)
        Condition.__post_init__(self)
        size = len(self.members)
        for name in _COUNT_FIELDS:
            value = getattr(self, name)
            if value is not None and value > size:
                raise self._fail(name, f"({value}) is larger than the number of members ({size})")
        for _, node in self.walk():
            if node is not self and node.evaluation_timeout is not None:
                # Named by the node itself: a decoder prefixes the enclosing set's path.
                raise ConditionError(
                    f"{node.label}: evaluation_timeout is only allowed on the root of a "
                    f"condition (found inside {self.label})"
                )
        seen: set[str] = set()
        for destination in self.destinations():
            if destination.name in seen:
                raise ConditionError(
                    f"{self.label}: destination {destination.name!r} appears twice "
                    "(duplicate destination)"
                )
            seen.add(destination.name)

    @property
    def label(self) -> str:
        return "set{" + ",".join(_short(m) for m in self.members) + "}"


def _check_size(root: DestinationSet) -> None:
    """Hold the tree within :data:`MAX_DEPTH` and :data:`MAX_NODES`, without recursion (a
    deeper tree would overflow the recursive walks before their checks)."""
    nodes, stack = 1, [(member, 2) for member in root.members]
    while stack:
        node, level = stack.pop()
        nodes += 1
        if level > MAX_DEPTH:
            raise ConditionError(
                f"{root.label}: the tree is deeper than {MAX_DEPTH} levels (MAX_DEPTH)"
            )
        if nodes > MAX_NODES:
            raise ConditionError(f"{root.label}: the tree has more than {MAX_NODES} nodes")
        stack.extend((member, level + 1) for member in node.members)


_ONE_MS = timedelta(milliseconds=1)


def _shown(value: object) -> str:
    """``repr(value)``, shortened for an error message."""
    text = repr(value)
    return text if len(text) <= 60 else f"{text[:57]}..."


def _short(node: Condition) -> str:
    return node.name if isinstance(node, Destination) else node.label


def condition_fields() -> tuple[str, ...]:
    """Names of the attributes every node has (for codecs and tooling)."""
    return tuple(f.name for f in fields(Condition))
