"""Hypothesis strategies for condition trees, ack histories and evaluation instants.

Shared by the unit property tests and by later suites (the Spark audit re-evaluation, the
evaluator's contract tests). Import them as ``from tests.unit.strategies import ...``.

Everything generated is *valid* by DESIGN section 5: unique destination names, whole
millisecond durations, counts within bounds and covered by a deadline of their kind, an
``evaluation_timeout`` only on the root and never shorter than the latest deadline.

Timestamps cluster on the instants where the semantics turn (each deadline ``D`` and the
evaluation deadline ``E``, with ``-1 us``, ``0`` and ``+1 us``), because that is where
off-by-one bugs live; the rest are spread uniformly over the CM's lifetime.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta, timezone

from hypothesis import strategies as st

from condmsg import Ack, AckKind, Condition, Destination, DestinationSet
from condmsg.core.timeutil import RESOLUTION

#: A fixed, unremarkable send instant for example-based tests.
SENT_AT = datetime(2024, 3, 4, 9, 0, tzinfo=UTC)

#: Durations (ms) that trees draw from: few distinct values make deadlines coincide.
COMMON_DURATIONS_MS = (1, 999, 1000, 1001, 2000, 5000, 10_000)

#: Identities used for topic subscribers and competing consumers.
RECIPIENTS = ("r1", "r2", "r3", "r4")

#: A destination name that no generated tree contains.
UNKNOWN_DESTINATION = "zz-not-in-the-tree"

_ms = timedelta(milliseconds=1)


# -- instants ---------------------------------------------------------------------------


def sent_ats() -> st.SearchStrategy[datetime]:
    """Aware send instants (microsecond precision), in UTC or a fixed non-UTC offset."""
    return st.datetimes(
        min_value=datetime(2000, 1, 1),
        max_value=datetime(2090, 1, 1),
        timezones=st.sampled_from(
            [UTC, timezone(timedelta(hours=2)), timezone(-timedelta(hours=5))]
        ),
    )


def evaluation_window(condition: Condition) -> timedelta:
    """``evaluation_timeout`` or the latest deadline (DESIGN 5), computed independently."""
    if condition.evaluation_timeout is not None:
        return condition.evaluation_timeout
    return max(
        d
        for _, node in condition.walk()
        for d in (node.pickup_within, node.process_within)
        if d is not None
    )


@functools.lru_cache(maxsize=256)
def turning_points(condition: Condition, sent_at: datetime) -> tuple[datetime, ...]:
    """Every deadline and the evaluation deadline, each with -1 us, 0 and +1 us, sorted."""
    bases = {sent_at, sent_at + evaluation_window(condition)}
    for _, node in condition.walk():
        for within in (node.pickup_within, node.process_within):
            if within is not None:
                bases.add(sent_at + within)
    return tuple(sorted({b + k * RESOLUTION for b in bases for k in (-1, 0, 1)}))


@functools.lru_cache(maxsize=256)
def instants(condition: Condition, sent_at: datetime) -> st.SearchStrategy[datetime]:
    """An instant from shortly before ``sent_at`` to a while after the evaluation deadline."""
    window_us = evaluation_window(condition) // RESOLUTION
    spread = st.integers(min_value=-1_000_000, max_value=window_us + 2_000_000).map(
        lambda us: sent_at + us * RESOLUTION
    )
    return st.one_of(st.sampled_from(turning_points(condition, sent_at)), spread)


# -- conditions -------------------------------------------------------------------------


@functools.cache
def durations(durations_ms: Sequence[int] = COMMON_DURATIONS_MS) -> st.SearchStrategy[timedelta]:
    """Positive whole-millisecond durations from ``durations_ms``.

    A few fixed values (rather than any integer) make deadlines coincide and sit 1 ms
    apart, which is where the semantics need care; it also keeps generation cheap.
    """
    return st.sampled_from([ms * _ms for ms in durations_ms])


@functools.cache
def _optional_durations(durations_ms: Sequence[int]) -> st.SearchStrategy[timedelta | None]:
    return st.sampled_from([None, None, *(ms * _ms for ms in durations_ms)])


# Strategies are built once: building them inside every draw dominates the run time.
_BOOL = st.booleans()
_OPTIONAL_BOOL = st.none() | _BOOL
_ANY_RECIPIENT = st.sampled_from([None, *RECIPIENTS])
_OTHER_RECIPIENT = {r: st.sampled_from([o for o in RECIPIENTS if o != r]) for r in RECIPIENTS}
_OPTIONAL_PRIORITY = st.none() | st.integers(min_value=0, max_value=9)
_ROUTING_KEY = st.none() | st.just("rk")
_SUBSCRIBERS = st.lists(st.sampled_from(RECIPIENTS), unique=True, max_size=len(RECIPIENTS))
_REPEATS = st.sampled_from([1, 1, 1, 2])
_COPIES = st.integers(min_value=1, max_value=3)
_COMMIT_DELAY_US = st.integers(min_value=0, max_value=3_000_000)


def _counts(draw: st.DrawFn, upper: int, allow_max: bool) -> tuple[int | None, int | None]:
    low = draw(_optional_int(0, upper))
    high = draw(_optional_int(low or 0, upper)) if allow_max else None
    return low, high


@functools.cache
def _optional_int(low: int, high: int) -> st.SearchStrategy[int | None]:
    return st.sampled_from([None, *range(low, high + 1)])


@st.composite
def conditions(
    draw: st.DrawFn,
    *,
    max_depth: int = 3,
    max_members: int = 3,
    max_counts: bool = True,
    topics: bool = True,
    named_recipients: bool = True,
    broker_properties: bool = False,
    durations_ms: Sequence[int] = COMMON_DURATIONS_MS,
) -> Condition:
    """A random valid condition tree (a root: it passes ``Condition.validate()``).

    ``max_counts=False`` leaves out every ``max_*`` (for monotonicity properties);
    ``topics`` and ``named_recipients`` allow pub/sub destinations and destinations that
    name a recipient; ``broker_properties`` adds expiry/persistent/priority at random.
    """
    names = (f"d{i}" for i in itertools.count())
    duration = durations(tuple(durations_ms))
    optional_duration = _optional_durations(tuple(durations_ms))
    shapes = st.sampled_from(
        ["queue"] + (["named"] if named_recipients else []) + (["topic", "topic"] if topics else [])
    )

    def broker() -> dict[str, object]:
        if not broker_properties:
            return {}
        return {
            "expiry": draw(optional_duration),
            "persistent": draw(_OPTIONAL_BOOL),
            "priority": draw(_OPTIONAL_PRIORITY),
        }

    def node(depth: int, covered: frozenset[str]) -> Condition:
        own = {
            "pickup_within": draw(optional_duration),
            "process_within": draw(optional_duration),
        }
        here = covered | {k.removesuffix("_within") for k, v in own.items() if v is not None}
        if depth >= max_depth or draw(_BOOL):
            return leaf(own, here)
        size = draw(st.integers(min_value=1, max_value=max_members))
        members = [node(depth + 1, here) for _ in range(size)]
        options: dict[str, object] = dict(own)
        for kind in ("pickup", "process"):
            if kind in here and draw(_BOOL):
                low, high = _counts(draw, size, max_counts)
                options[f"min_{kind}"], options[f"max_{kind}"] = low, high
        return DestinationSet(*members, **options, **broker())  # type: ignore[arg-type]

    def leaf(own: dict[str, object], here: frozenset[str]) -> Destination:
        name = next(names)
        shape = draw(shapes)
        options: dict[str, object] = dict(own)
        if shape == "named":
            options["recipient"] = draw(st.sampled_from(RECIPIENTS))
        elif shape == "topic":
            options["exchange"] = "events"
            options["routing_key"] = draw(_ROUTING_KEY)
            for kind in ("pickup", "process"):
                if kind in here and draw(_BOOL):
                    low, high = _counts(draw, len(RECIPIENTS), max_counts)
                    options[f"min_{kind}"], options[f"max_{kind}"] = low, high
        return Destination(name, **options, **broker())  # type: ignore[arg-type]

    tree = node(0, frozenset())
    latest = max(tree.deadlines(), default=None)
    root_options: dict[str, object] = {}
    if latest is None:
        # A condition needs a time constraint somewhere: put one on the root.
        root_options["pickup_within"] = draw(duration)
        latest = root_options["pickup_within"]
    if draw(_BOOL):
        extra = draw(st.sampled_from([0, 1, 500, 3000]))
        root_options["evaluation_timeout"] = latest + extra * _ms  # type: ignore[operator]
    if root_options:
        tree = _with(tree, **root_options)
    tree.validate()
    return tree


def _with(node: Condition, **changes: object) -> Condition:
    """``node`` rebuilt with some attributes changed (frozen dataclasses)."""
    attrs = {
        name: getattr(node, name)
        for name in (
            "pickup_within",
            "process_within",
            "min_pickup",
            "max_pickup",
            "min_process",
            "max_process",
            "expiry",
            "persistent",
            "priority",
            "evaluation_timeout",
        )
    }
    attrs.update(changes)
    if isinstance(node, Destination):
        return Destination(
            node.name,
            recipient=node.recipient,
            exchange=node.exchange,
            routing_key=node.routing_key,
            **attrs,  # type: ignore[arg-type]
        )
    return DestinationSet(*node.members, **attrs)  # type: ignore[arg-type]


def has_max_counts(condition: Condition) -> bool:
    return any(
        node.max_pickup is not None or node.max_process is not None for _, node in condition.walk()
    )


# -- acks -------------------------------------------------------------------------------


@functools.cache
def _index(size: int) -> st.SearchStrategy[int]:
    return st.integers(min_value=0, max_value=size - 1)


def _draw_ack(
    draw: st.DrawFn,
    condition: Condition,
    sent_at: datetime,
    destination: str,
    recipient: str | None,
) -> Ack:
    # Plain draws from cached strategies: building strategies per ack is slow.
    read_at = draw(instants(condition, sent_at))
    if draw(_BOOL):
        return Ack(destination=destination, kind=AckKind.READ, read_at=read_at, recipient=recipient)
    after = [t for t in turning_points(condition, sent_at) if t >= read_at]
    if after and draw(_BOOL):
        committed_at = after[draw(_index(len(after)))]
    else:
        committed_at = read_at + draw(_COMMIT_DELAY_US) * RESOLUTION
    return Ack(
        destination=destination,
        kind=AckKind.COMMIT,
        read_at=read_at,
        committed_at=committed_at,
        recipient=recipient,
    )


@st.composite
def acks(
    draw: st.DrawFn,
    condition: Condition,
    sent_at: datetime,
    destination: str,
    recipient: str | None = None,
) -> Ack:
    """One READ or COMMIT ack for ``destination``, timestamps from :func:`instants`."""
    return _draw_ack(draw, condition, sent_at, destination, recipient)


@st.composite
def ack_histories(
    draw: st.DrawFn,
    condition: Condition,
    sent_at: datetime,
    *,
    consumed_once: bool = True,
    strays: bool = True,
) -> list[Ack]:
    """A shuffled list of acks for the destinations of ``condition``.

    With ``consumed_once`` (the default, as the broker guarantees) a queue copy yields at
    most one ack and so does each subscriber's copy of a topic; a topic may still carry a
    verbatim duplicate (a relay redelivering an ack). With ``strays``, acks that must not
    count are mixed in: acks for a destination outside the tree, and acks from recipients
    other than the one a destination names.
    """
    history: list[Ack] = []
    for leaf in condition.destinations():
        copies = 1 if consumed_once else draw(_COPIES)
        if leaf.is_topic:
            subscribers = draw(_SUBSCRIBERS)
            for who in subscribers:
                ack = _draw_ack(draw, condition, sent_at, leaf.name, who)
                history.extend([ack] * draw(_REPEATS))
        else:
            for _ in range(copies):
                if draw(_BOOL):
                    history.append(_draw_ack(draw, condition, sent_at, leaf.name, leaf.recipient))
        if strays and leaf.recipient is not None and draw(_BOOL):
            other = draw(_OTHER_RECIPIENT[leaf.recipient])
            history.append(_draw_ack(draw, condition, sent_at, leaf.name, other))
    if strays and draw(_BOOL):
        history.append(_draw_ack(draw, condition, sent_at, UNKNOWN_DESTINATION, None))
    return draw(st.permutations(history))


def in_time_history(condition: Condition, sent_at: datetime) -> list[Ack]:
    """Every destination (and every topic subscriber) reads and commits at ``sent_at``.

    For a tree without ``max_*`` counts this satisfies every constraint.
    """
    history = []
    for leaf in condition.destinations():
        who: Sequence[str | None] = RECIPIENTS if leaf.is_topic else [leaf.recipient]
        for recipient in who:
            history.append(
                Ack(
                    destination=leaf.name,
                    kind=AckKind.COMMIT,
                    read_at=sent_at,
                    committed_at=sent_at,
                    recipient=recipient,
                )
            )
    return history


@st.composite
def any_acks(draw: st.DrawFn, condition: Condition, sent_at: datetime) -> Ack:
    """One arbitrary ack: any destination of the tree (or a stray one), any recipient."""
    names = [d.name for d in condition.destinations()] + [UNKNOWN_DESTINATION]
    name = names[draw(_index(len(names)))]
    return _draw_ack(draw, condition, sent_at, name, draw(_ANY_RECIPIENT))


@st.composite
def scenarios(
    draw: st.DrawFn, **condition_options: object
) -> tuple[Condition, datetime, list[Ack], datetime]:
    """``(condition, sent_at, acks, now)``: a complete input for ``evaluate``."""
    condition = draw(conditions(**condition_options))  # type: ignore[arg-type]
    sent_at = draw(sent_ats())
    history = draw(ack_histories(condition, sent_at))
    now = draw(instants(condition, sent_at))
    return condition, sent_at, history, now
