"""What the audit needs to know about one condition, computed once per distinct condition.

Pure Python (no pyspark): :func:`plan_of` decodes a ``condition_json`` with
:func:`condmsg.core.condition_codec.condition_from_json` and returns a :class:`Plan`:

* ``shape``: a signature of the tree with names and durations removed, e.g.
  ``set(pickup)[queue(process),set(process,min_process=2)[queue,queue,queue]]``. Members
  are sorted, so two conditions that differ only in names, deadlines or member order share
  a shape. Rates are reported by shape.
* ``skeleton``: the tree's structure in member order with the *presence* of every time
  and count constraint (no names, durations, recipients or count values). Conditions with
  one skeleton are judged by one compiled Spark expression
  (:mod:`spark_audit.reevaluate.compiled`) whose parameters (deadlines, counts) are the
  plan's arrays.
* the numbered tree: nodes in ``Condition.walk`` order (pre-order) with their parameters,
  leaves (destinations) in the same order with the tightest deadlines that apply to each
  (its own or an enclosing set's), and the *probes* of the topic destinations (see
  :class:`Probe`).
* ``native``: whether the compiled expression judges it (the tree fits the limits below);
  other trees are judged by ``condmsg.evaluate`` itself.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from condmsg.core.condition_codec import condition_from_json
from condmsg.core.conditions import Condition, Destination, DestinationSet, Kind
from condmsg.core.errors import ConditionError
from condmsg.core.timeutil import to_ms

#: At most this many topic probes per condition for the compiled path.
MAX_PROBES = 8
#: Upper bound of the compiled expression's size (node evaluations over all constraints).
MAX_COST = 200


@dataclass(frozen=True, slots=True, kw_only=True)
class Leaf:
    """One destination of the tree (slot = its position in ``Condition.destinations()``)."""

    name: str
    recipient: str | None
    is_topic: bool
    required: bool
    #: The tightest deadlines (ms after ``sent_at``) that apply: its own or a set's.
    pickup_ms: int | None
    process_ms: int | None


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeParams:
    """The parameters of one node (index = its position in ``Condition.walk()``)."""

    pickup_ms: int | None
    process_ms: int | None
    min_pickup: int | None
    max_pickup: int | None
    min_process: int | None
    max_process: int | None


@dataclass(frozen=True, slots=True, kw_only=True)
class Probe:
    """How many recipients of a topic destination acked in time for one constraint.

    A topic destination is judged per recipient (DESIGN section 5), so the compiled path
    needs, for every constraint that reaches the topic leaf in ``slot``, the number of
    recipients whose first read (``kind`` pickup) or first commit (process) is at or
    before the deadline of node ``node`` (the constraint's owner): ``ms`` after sent_at.
    """

    slot: int
    kind: Kind
    node: int
    ms: int


@dataclass(frozen=True, slots=True)
class Numbered:
    """A node of a condition tree with its pre-order index (and leaf slot)."""

    index: int
    node: Condition
    slot: int | None
    children: tuple[Numbered, ...]
    #: Indices of the enclosing nodes, root first.
    ancestors: tuple[int, ...]


def numbered(condition: Condition) -> Numbered:
    """``condition`` numbered like ``walk()`` (nodes) and ``destinations()`` (leaves)."""
    counter = {"node": 0, "slot": 0}

    def visit(node: Condition, ancestors: tuple[int, ...]) -> Numbered:
        index = counter["node"]
        counter["node"] += 1
        slot = None
        if isinstance(node, Destination):
            slot = counter["slot"]
            counter["slot"] += 1
        children = tuple(visit(m, (*ancestors, index)) for m in node.members)
        return Numbered(index, node, slot, children, ancestors)

    return visit(condition, ())


def nodes_of(tree: Numbered) -> Iterator[Numbered]:
    yield tree
    for child in tree.children:
        yield from nodes_of(child)


def probes_of(tree: Numbered) -> tuple[Probe, ...]:
    """Every probe of ``tree``'s topic leaves, in a fixed order (see :class:`Probe`)."""
    by_index = {n.index: n.node for n in nodes_of(tree)}
    found: list[Probe] = []
    for leaf in nodes_of(tree):
        node = leaf.node
        if not (isinstance(node, Destination) and node.is_topic) or leaf.slot is None:
            continue
        for kind in Kind:
            for owner in (*leaf.ancestors, leaf.index):
                within = by_index[owner].within(kind)
                if within is not None:
                    found.append(Probe(slot=leaf.slot, kind=kind, node=owner, ms=to_ms(within)))
    return tuple(found)


def probe_index(probes: tuple[Probe, ...]) -> dict[tuple[int, Kind, int], int]:
    return {(p.slot, p.kind, p.node): j for j, p in enumerate(probes)}


@dataclass(frozen=True, slots=True, kw_only=True)
class Plan:
    condition_json: str
    valid: bool
    error: str | None
    shape: str
    skeleton: str
    eval_window_ms: int | None
    native: bool
    leaves: tuple[Leaf, ...]
    nodes: tuple[NodeParams, ...]
    probes: tuple[Probe, ...]

    def as_row(self) -> dict[str, Any]:
        """A plain dict in the layout of :data:`spark_audit.transforms.conditions.PLAN_SCHEMA`."""
        return {
            "condition_json": self.condition_json,
            "valid": self.valid,
            "error": self.error,
            "shape": self.shape,
            "skeleton": self.skeleton,
            "eval_window_ms": self.eval_window_ms,
            "structurally_native": self.native,
            "leaf_count": len(self.leaves),
            "leaf_names": [leaf.name for leaf in self.leaves],
            "leaf_recipients": [leaf.recipient for leaf in self.leaves],
            "leaf_topic": [leaf.is_topic for leaf in self.leaves],
            "leaf_required": [leaf.required for leaf in self.leaves],
            "leaf_pickup_ms": [leaf.pickup_ms for leaf in self.leaves],
            "leaf_process_ms": [leaf.process_ms for leaf in self.leaves],
            "node_pickup_ms": [n.pickup_ms for n in self.nodes],
            "node_process_ms": [n.process_ms for n in self.nodes],
            "node_min_pickup": [n.min_pickup for n in self.nodes],
            "node_max_pickup": [n.max_pickup for n in self.nodes],
            "node_min_process": [n.min_process for n in self.nodes],
            "node_max_process": [n.max_process for n in self.nodes],
            "probe_slot": [p.slot for p in self.probes],
            "probe_process": [p.kind is Kind.PROCESS for p in self.probes],
            "probe_ms": [p.ms for p in self.probes],
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


def skeleton_of(node: Condition) -> str:
    """The skeleton signature of ``node`` (see the module doc)."""
    attrs = []
    for kind in Kind:
        if node.within(kind) is not None:
            attrs.append(str(kind))
        if node.min_count(kind) is not None:
            attrs.append(f"min_{kind}")
        if node.max_count(kind) is not None:
            attrs.append(f"max_{kind}")
    head = "set" if not isinstance(node, Destination) else "topic" if node.is_topic else "queue"
    text = f"{head}({','.join(attrs)})"
    if node.members:
        text += "[" + ",".join(skeleton_of(m) for m in node.members) + "]"
    return text


def cost_of(tree: Numbered) -> int:
    """The size of the compiled expression: every constraint evaluates its subtree."""

    def size(item: Numbered) -> int:
        return 1 + sum(size(child) for child in item.children)

    return sum(
        size(item) for item in nodes_of(tree) for kind in Kind if item.node.within(kind) is not None
    )


def _leaves(tree: Numbered) -> tuple[Leaf, ...]:
    by_index = {n.index: n.node for n in nodes_of(tree)}

    def tightest(item: Numbered, kind: Kind) -> int | None:
        values = [_ms(by_index[i], kind) for i in (*item.ancestors, item.index)]
        present = [v for v in values if v is not None]
        return min(present) if present else None

    found = []
    for item in nodes_of(tree):
        node = item.node
        if isinstance(node, Destination):
            found.append(
                Leaf(
                    name=node.name,
                    recipient=node.recipient,
                    is_topic=node.is_topic,
                    required=node.is_required,
                    pickup_ms=tightest(item, Kind.PICKUP),
                    process_ms=tightest(item, Kind.PROCESS),
                )
            )
    return tuple(found)


def plan_of(condition_json: str) -> Plan:
    """The :class:`Plan` of one stored condition (``valid=False`` if it does not decode)."""
    try:
        condition = condition_from_json(condition_json)
    except ConditionError as exc:
        return _invalid(condition_json, str(exc))
    tree = numbered(condition)
    probes = probes_of(tree)
    return Plan(
        condition_json=condition_json,
        valid=True,
        error=None,
        shape=shape_of(condition),
        skeleton=skeleton_of(condition),
        eval_window_ms=to_ms(condition.evaluation_window()),
        native=len(probes) <= MAX_PROBES and cost_of(tree) <= MAX_COST,
        leaves=_leaves(tree),
        nodes=tuple(
            NodeParams(
                pickup_ms=_ms(n.node, Kind.PICKUP),
                process_ms=_ms(n.node, Kind.PROCESS),
                min_pickup=n.node.min_pickup,
                max_pickup=n.node.max_pickup,
                min_process=n.node.min_process,
                max_process=n.node.max_process,
            )
            for n in nodes_of(tree)
        ),
        probes=probes,
    )


def _invalid(condition_json: str, error: str) -> Plan:
    return Plan(
        condition_json=condition_json,
        valid=False,
        error=error,
        shape="invalid",
        skeleton="invalid",
        eval_window_ms=None,
        native=False,
        leaves=(),
        nodes=(),
        probes=(),
    )
