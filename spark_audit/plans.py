"""What the audit needs to know about one condition, computed once per distinct condition.

Pure Python (no pyspark): :func:`plan_of` decodes a ``condition_json`` with
:meth:`condmsg.Condition.from_json` and returns a :class:`Plan`:

* ``shape``: a signature of the tree with names and durations removed, e.g.
  ``set(pickup)[queue(process),set(process,min_process=2)[queue,queue,queue]]``. Members
  are sorted, so two conditions that differ only in names, deadlines or member order share
  a shape. Rates are reported by shape.
* the *native plan*: when the tree is a single queue ``Destination`` or a flat
  ``DestinationSet`` of queue destinations, the constraints in a form the Spark
  re-evaluation computes with native expressions (:mod:`spark_audit.reevaluate.native`).
  Any other tree (nested sets, topic destinations) is re-evaluated by ``condmsg.evaluate``
  itself (:mod:`spark_audit.reevaluate.fallback`).
* per destination, the tightest pickup and processing deadline that applies to it (its own
  or an enclosing set's), for deadline-miss rates.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from condmsg.conditions import Condition, Destination, DestinationSet, Kind
from condmsg.errors import ConditionError
from condmsg.timeutil import to_ms


@dataclass(frozen=True, slots=True, kw_only=True)
class Member:
    """A queue destination of a natively evaluated condition (durations in ms)."""

    name: str
    recipient: str | None
    own_pickup_ms: int | None
    own_process_ms: int | None


@dataclass(frozen=True, slots=True, kw_only=True)
class DestinationDeadlines:
    """The tightest deadlines (ms after ``sent_at``) that apply to one destination."""

    destination: str
    recipient: str | None
    is_topic: bool
    required: bool
    pickup_ms: int | None
    process_ms: int | None


@dataclass(frozen=True, slots=True, kw_only=True)
class Plan:
    condition_json: str
    valid: bool
    error: str | None
    shape: str
    eval_window_ms: int | None
    native: bool
    members: tuple[Member, ...]
    set_pickup_ms: int | None
    set_process_ms: int | None
    min_pickup: int | None
    max_pickup: int | None
    min_process: int | None
    max_process: int | None
    destinations: tuple[DestinationDeadlines, ...]

    def as_row(self) -> dict[str, Any]:
        """A plain dict in the layout of :data:`spark_audit.transforms.conditions.PLAN_SCHEMA`."""
        return {
            "condition_json": self.condition_json,
            "valid": self.valid,
            "error": self.error,
            "shape": self.shape,
            "eval_window_ms": self.eval_window_ms,
            "native": self.native,
            "members": [
                {
                    "name": m.name,
                    "recipient": m.recipient,
                    "own_pickup_ms": m.own_pickup_ms,
                    "own_process_ms": m.own_process_ms,
                }
                for m in self.members
            ],
            "set_pickup_ms": self.set_pickup_ms,
            "set_process_ms": self.set_process_ms,
            "min_pickup": self.min_pickup,
            "max_pickup": self.max_pickup,
            "min_process": self.min_process,
            "max_process": self.max_process,
            "destinations": [
                {
                    "destination": d.destination,
                    "recipient": d.recipient,
                    "is_topic": d.is_topic,
                    "required": d.required,
                    "pickup_ms": d.pickup_ms,
                    "process_ms": d.process_ms,
                }
                for d in self.destinations
            ],
        }


def _ms(node: Condition, kind: Kind) -> int | None:
    within = node.within(kind)
    return None if within is None else to_ms(within)


def shape_of(node: Condition, *, root: bool = True) -> str:
    """The shape signature of ``node`` (see the module doc)."""
    attrs = [str(kind) for kind in Kind if node.within(kind) is not None]
    for kind in Kind:
        for bound, value in (("min", node.min_count(kind)), ("max", node.max_count(kind))):
            if value is not None:
                attrs.append(f"{bound}_{kind}={value}")
    if isinstance(node, Destination):
        if node.recipient is not None:
            attrs.append("recipient")
        head = "topic" if node.is_topic else "queue"
    else:
        head = "set"
    if root and node.evaluation_timeout is not None:
        attrs.append("timeout")
    text = f"{head}({','.join(attrs)})" if attrs else head
    if isinstance(node, DestinationSet):
        members = sorted(shape_of(m, root=False) for m in node.members)
        text += "[" + ",".join(members) + "]"
    return text


def _deadlines(condition: Condition) -> tuple[DestinationDeadlines, ...]:
    found: list[DestinationDeadlines] = []

    def tighter(a: int | None, b: int | None) -> int | None:
        return b if a is None else a if b is None else min(a, b)

    def visit(node: Condition, pickup: int | None, process: int | None) -> None:
        pickup = tighter(pickup, _ms(node, Kind.PICKUP))
        process = tighter(process, _ms(node, Kind.PROCESS))
        if isinstance(node, Destination):
            found.append(
                DestinationDeadlines(
                    destination=node.name,
                    recipient=node.recipient,
                    is_topic=node.is_topic,
                    required=node.is_required,
                    pickup_ms=pickup,
                    process_ms=process,
                )
            )
        for member in node.members:
            visit(member, pickup, process)

    visit(condition, None, None)
    return tuple(found)


def _member(node: Destination) -> Member:
    return Member(
        name=node.name,
        recipient=node.recipient,
        own_pickup_ms=_ms(node, Kind.PICKUP),
        own_process_ms=_ms(node, Kind.PROCESS),
    )


def plan_of(condition_json: str) -> Plan:
    """The :class:`Plan` of one stored condition (``valid=False`` if it does not decode)."""
    try:
        condition = Condition.from_json(condition_json)
    except ConditionError as exc:
        return _invalid(condition_json, str(exc))
    queues_only = all(isinstance(m, Destination) and not m.is_topic for m in condition.members)
    if isinstance(condition, Destination):
        native = not condition.is_topic
        members: tuple[Member, ...] = (_member(condition),) if native else ()
        root_set: Condition | None = None
    else:
        native = queues_only
        members = (
            tuple(_member(m) for m in condition.members if isinstance(m, Destination))
            if native
            else ()
        )
        root_set = condition
    return Plan(
        condition_json=condition_json,
        valid=True,
        error=None,
        shape=shape_of(condition),
        eval_window_ms=to_ms(condition.evaluation_window()),
        native=native,
        members=members,
        set_pickup_ms=_ms(root_set, Kind.PICKUP) if root_set else None,
        set_process_ms=_ms(root_set, Kind.PROCESS) if root_set else None,
        min_pickup=root_set.min_pickup if root_set else None,
        max_pickup=root_set.max_pickup if root_set else None,
        min_process=root_set.min_process if root_set else None,
        max_process=root_set.max_process if root_set else None,
        destinations=_deadlines(condition),
    )


def _invalid(condition_json: str, error: str) -> Plan:
    return Plan(
        condition_json=condition_json,
        valid=False,
        error=error,
        shape="invalid",
        eval_window_ms=None,
        native=False,
        members=(),
        set_pickup_ms=None,
        set_process_ms=None,
        min_pickup=None,
        max_pickup=None,
        min_process=None,
        max_process=None,
        destinations=(),
    )
