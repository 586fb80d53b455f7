"""``condmsg.evaluate`` compiled into Spark expressions, one per condition skeleton.

Three-valued logic is encoded as integers: TRUE = 1, UNKNOWN = 0, FALSE = -1, so Kleene's
AND is ``least`` (nulls, i.e. absent constraints, are ignored). Instants are integer
microseconds since the epoch (``unix_micros``), the resolution of ``condmsg`` datetimes, so
a deadline is inclusive exactly as in ``evaluate``.

The tree's *structure* is compiled (:func:`verdict_value` walks a representative tree of
the skeleton, see :mod:`spark_audit.plans`); its *parameters* are read from the CM's plan
arrays (``node_pickup_ms[k]``, ``node_min_process[k]``, ...), so one expression judges every
condition of a skeleton whatever its names, deadlines and counts. The inputs are a CM's
facts per destination slot ``i`` and per topic probe ``j``
(:func:`spark_audit.transforms.facts.cm_facts`), for one set of acks (the *variant*: the
counted acks, or every well-formed ack):

* ``{v}_n{i}``: matching acks (only whether there are any is read: the audit gives 1 or
  0), ``{v}_r{i}`` first ``read_at``, ``{v}_m{i}`` first ``committed_at`` of a COMMIT ack
  (recipient-filtered where the destination names one);
* ``{v}_h{j}``: recipients of a topic destination in time for probe ``j``.

The rules, for one consumption (a queue copy, or one recipient of a topic) with ``n``
acks at deadline ``D``, instant ``now`` and ``final = now >= sent_at + window``:

* picked up by D: TRUE if ``first_read <= D``; else FALSE if ``n > 0`` or ``final``; else
  UNKNOWN;
* processed by D: TRUE if ``first_commit <= D``; else FALSE if ``n > 0`` or ``now > D`` or
  ``final``; else UNKNOWN;
* a topic destination: ``held`` recipients in time; while the pool is open (not final,
  and for processing ``now <= D``) unseen recipients may still report: with counts,
  ``min`` is TRUE once held and ``max`` FALSE once exceeded, else UNKNOWN; without counts
  TRUE if anyone held. Once closed, the count rule with no unknowns, or FALSE;
* a set: its members judged at the same deadline, combined by the count rule for that
  kind (``held`` TRUE, ``unknown`` UNKNOWN members) when it has ``min_``/``max_``, else AND.

Every node's own constraints are judged at their own deadlines and the verdict is the AND
of all of them, as in ``evaluate``. The hypothesis test in ``tests/spark`` checks the
compiled expressions against ``evaluate`` on generated histories.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from condmsg.core.conditions import Destination, Kind
from spark_audit.plans import Numbered, nodes_of, probe_index, probes_of

TRUE, UNKNOWN, FALSE = 1, 0, -1
#: A set's count rule adds up its members' values in one integer: held + unknown * this.
_UNKNOWN_BITS = 16
_UNKNOWN_UNIT = 1 << _UNKNOWN_BITS

# The expressions are Spark SQL text: one parse per column instead of a Py4J call per
# node of the expression tree (thousands of calls for a few skeletons otherwise).
Sql = str


@dataclass(frozen=True, slots=True)
class Facts:
    """The fact columns of one variant (``c`` counted acks, ``a`` every well-formed ack)."""

    variant: str
    #: What-if variants (:mod:`spark_audit.what_if`): a suffix of the variant's plan
    #: arrays and stage columns, and its probe counts read from the array column ``hits``
    #: at the row's offset column ``offset`` (every variant's probes share one array).
    tag: str = ""
    hits: str | None = None
    offset: str | None = None

    # The non-null copies of the facts (stage 0, see :class:`Compiled`): a comparison of
    # non-nullable values generates a fraction of the code of a nullable one.
    def n(self, slot: int) -> Sql:
        return f"_{self.variant}n{slot}"

    def first(self, slot: int, kind: Kind) -> Sql:
        return f"_{self.variant}{'r' if kind is Kind.PICKUP else 'm'}{slot}"

    def held(self, probe: int) -> Sql:
        return f"_{self.variant}h{probe}{self.tag}"

    def inputs(self, slot: int | None, probe: int | None) -> dict[str, Sql]:
        """Stage-0 columns: the facts made non-null (a missing first read or commit is
        later than any deadline, a missing count is 0)."""
        v = self.variant
        found: dict[str, Sql] = {}
        if slot is not None:
            found[self.n(slot)] = f"coalesce({v}_n{slot}, 0)"
            for kind in Kind:
                column = f"{v}_{'r' if kind is Kind.PICKUP else 'm'}{slot}"
                found[self.first(slot, kind)] = f"coalesce({column}, {_LATEST})"
        if probe is not None and self.hits is not None:
            found[self.held(probe)] = f"coalesce(get({self.hits}, {self.offset} + {probe}), 0)"
        elif probe is not None:
            found[self.held(probe)] = f"coalesce({v}_h{probe}, 0)"
        return found


COUNTED, ALL = Facts("c"), Facts("a")
#: Later than any instant (µs): a first read or commit that did not happen.
_LATEST = (1 << 63) - 1
#: Stage-0 columns every verdict reads: the instant of judgement and whether it is final.
_CLOCK = {"_at": "coalesce(at_us, 0)", "_fin": "coalesce(final, false)"}


def _param(name: str, index: int) -> Sql:
    # ``get``: null rather than an error (ANSI mode) for an index past the array's end.
    return f"get({name}, {index})"


def _deadline(owner: int, kind: Kind, tag: str) -> Sql:
    return f"coalesce(sent_us + {_param(f'node_{kind}_ms{tag}', owner)} * 1000, 0)"


def _case(*branches: tuple[Sql, int], otherwise: int) -> Sql:
    whens = " ".join(f"WHEN {condition} THEN {value}" for condition, value in branches)
    return f"CASE {whens} ELSE {otherwise} END"


def _single(facts: Facts, slot: int, kind: Kind, deadline: Sql) -> Sql:
    late = f"{facts.n(slot)} > 0 OR _fin"
    if kind is Kind.PROCESS:
        late += f" OR _at > {deadline}"
    return _case(
        (f"{facts.first(slot, kind)} <= {deadline}", TRUE), (late, FALSE), otherwise=UNKNOWN
    )


def _bounds(item: Numbered, kind: Kind, tag: str) -> tuple[Sql | None, Sql | None]:
    """The node's count bounds (non-null stage-0 columns), where its skeleton has them."""
    node = item.node
    low = f"_lo{kind.value[1]}{item.index}{tag}" if node.min_count(kind) is not None else None
    high = f"_hi{kind.value[1]}{item.index}{tag}" if node.max_count(kind) is not None else None
    return low, high


def _bound_inputs(item: Numbered, kind: Kind, tag: str) -> dict[str, Sql]:
    low, high = _bounds(item, kind, tag)
    found = {}
    if low is not None:
        found[low] = f"coalesce({_param(f'node_min_{kind}{tag}', item.index)}, 0)"
    if high is not None:
        found[high] = f"coalesce({_param(f'node_max_{kind}{tag}', item.index)}, 0)"
    return found


def _all_of(values: list[Sql]) -> Sql:
    return values[0] if len(values) == 1 else f"least({', '.join(values)})"


def _topic(facts: Facts, item: Numbered, kind: Kind, deadline: Sql, probe: int) -> Sql:
    held = facts.held(probe)
    pool_open = "(NOT _fin)" if kind is Kind.PICKUP else f"(NOT _fin AND _at <= {deadline})"
    low, high = _bounds(item, kind, facts.tag)
    if low is None and high is None:
        return _case((f"{held} > 0", TRUE), (pool_open, UNKNOWN), otherwise=FALSE)
    parts = []
    if low is not None:
        parts.append(_case((f"{held} >= {low}", TRUE), (pool_open, UNKNOWN), otherwise=FALSE))
    if high is not None:
        parts.append(_case((f"{held} > {high}", FALSE), (pool_open, UNKNOWN), otherwise=TRUE))
    return _all_of(parts)


def _tally(values: list[Sql]) -> Sql:
    """``held + unknown * 2^16`` over the members' values."""
    terms = [
        _case((f"{v} = {TRUE}", 1), (f"{v} = {UNKNOWN}", _UNKNOWN_UNIT), otherwise=0)
        for v in values
    ]
    return " + ".join(terms)


def _count_rule(tally: Sql, low: Sql | None, high: Sql | None) -> Sql:
    held = f"({tally} % {_UNKNOWN_UNIT})"
    possible = f"({held} + shiftright({tally}, {_UNKNOWN_BITS}))"
    parts = []
    if low is not None:
        parts.append(
            _case((f"{held} >= {low}", TRUE), (f"{possible} < {low}", FALSE), otherwise=UNKNOWN)
        )
    if high is not None:
        parts.append(
            _case((f"{held} > {high}", FALSE), (f"{possible} <= {high}", TRUE), otherwise=UNKNOWN)
        )
    return _all_of(parts)


@dataclass
class Compiled:
    """Verdict expressions in stages, so that the generated code stays small.

    Stage 0 holds every deadline the compiled skeletons use (``sent_us`` plus a node's
    duration) and non-null copies of the facts, counts and clock they read (smaller
    generated code: HotSpot does not compile a method over 8000 bytes of bytecode),
    stage 1 every queue leaf's value at such a deadline and every topic
    leaf's, both shared by all skeletons (the parameters are the row's own plan arrays);
    later stages hold the tallies and values of sets with counts (a count rule reads its
    members several times; inlined, nested counts would grow exponentially). Each
    skeleton's verdict is then a small expression over those columns, and ``values``
    maps a variant (:data:`COUNTED`, :data:`ALL`) to the verdict of every compiled CM
    (null for the others). ``stages`` are ``"<sql> AS <name>"`` items for
    ``selectExpr("*", ...)``, to select in turn before the values (Spark does not
    collapse projections that would duplicate non-trivial expressions).
    """

    stages: list[list[Sql]]
    values: dict[str, Sql]


class _Builder:
    def __init__(self, tag: str = "", shared: Mapping[Kind, str] | None = None) -> None:
        self.stages: dict[int, dict[str, Sql]] = {}
        self.tag = tag
        self.shared = shared or {}

    def _column(self, level: int, name: str, expr: Sql) -> Sql:
        self.stages.setdefault(level, {}).setdefault(name, f"{expr} AS {name}")
        return name

    def _inputs(self, columns: dict[str, Sql]) -> None:
        for name, expr in {**_CLOCK, **columns}.items():
            self._column(0, name, expr)

    def deadline(self, owner: int, kind: Kind) -> Sql:
        tag = self.shared.get(kind, self.tag)
        return self._column(0, f"_d{kind.value[1]}{owner}{tag}", _deadline(owner, kind, tag))

    def leaf(self, facts: Facts, slot: int, kind: Kind, owner: int) -> Sql:
        self._inputs(facts.inputs(slot, None))
        deadline = self.deadline(owner, kind)
        # A queue leaf reads only the facts and its deadline: named by the deadline's tag.
        name = f"_{facts.variant}{kind.value[1]}{slot}_{owner}{self.shared.get(kind, self.tag)}"
        return self._column(1, name, _single(facts, slot, kind, deadline))

    def holds(
        self,
        skel_id: int,
        facts: Facts,
        probes: dict[tuple[int, Kind, int], int],
        item: Numbered,
        kind: Kind,
        owner: int,
    ) -> tuple[Sql, int]:
        """The value of ``item`` for constraint (``owner``, ``kind``), and the number of
        stages it needs."""
        node = item.node
        if isinstance(node, Destination):
            assert item.slot is not None
            if not node.is_topic:
                return self.leaf(facts, item.slot, kind, owner), 2
            probe = probes[(item.slot, kind, owner)]
            self._inputs({**facts.inputs(None, probe), **_bound_inputs(item, kind, self.tag)})
            value = _topic(facts, item, kind, self.deadline(owner, kind), probe)
            name = f"_{facts.variant}{skel_id}t{probe}{self.tag}"
            hit = f"skel_id{self.tag} = {skel_id}"
            return self._column(1, name, f"CASE WHEN {hit} THEN {value} END"), 2
        judged = [self.holds(skel_id, facts, probes, c, kind, owner) for c in item.children]
        values = [value for value, _ in judged]
        level = max(needed for _, needed in judged)
        low, high = _bounds(item, kind, self.tag)
        if low is None and high is None:
            return _all_of(values), level
        self._inputs(_bound_inputs(item, kind, self.tag))
        name = f"_{facts.variant}{skel_id}{kind.value[1]}{owner}_{item.index}{self.tag}"
        hit = f"skel_id{self.tag} = {skel_id}"
        tally = self._column(level, f"{name}t", f"CASE WHEN {hit} THEN {_tally(values)} END")
        rule = _count_rule(tally, low, high)
        value = self._column(level + 1, f"{name}v", f"CASE WHEN {hit} THEN {rule} END")
        return value, level + 2

    def verdict(self, skel_id: int, tree: Numbered, facts: Facts) -> Sql:
        probes = probe_index(probes_of(tree))
        constraints = [
            self.holds(skel_id, facts, probes, item, kind, item.index)[0]
            for item in nodes_of(tree)
            for kind in Kind
            if item.node.within(kind) is not None
        ]
        return _all_of(constraints)


def verdict_name(value: Sql) -> Sql:
    return (
        f"CASE WHEN {value} = {TRUE} THEN 'satisfied' WHEN {value} = {FALSE} THEN 'violated' "
        f"WHEN {value} = {UNKNOWN} THEN 'pending' END"
    )


def compiled_values(
    skeletons: Mapping[int, Numbered],
    variants: tuple[Facts, ...] = (COUNTED,),
    tag: str = "",
    shared: Mapping[Kind, str] | None = None,
) -> Compiled:
    """The verdict values of every compiled CM, per variant (see :class:`Compiled`).

    Expects ``skel_id``, ``sent_us``, ``at_us``, ``final``, the plan arrays and the fact
    columns of the variants on the row; with a ``tag`` (what-if variants, the same as the
    variants' :attr:`Facts.tag`), ``skel_id{tag}`` and the plan arrays ``node_*{tag}``.
    ``shared`` maps a kind to the tag of a variant whose ``node_{kind}_ms`` arrays are
    this one's on every row: its deadlines of that kind and the queue leaves judged at
    them are that variant's columns, computed once for both (a sweep of one deadline
    leaves the other kind's as recorded).
    """
    builder = _Builder(tag, shared)
    values: dict[str, Sql] = {}
    for facts in variants:
        branches = [
            f"WHEN skel_id{tag} = {skel_id} THEN {builder.verdict(skel_id, tree, facts)}"
            for skel_id, tree in sorted(skeletons.items())
        ]
        values[facts.variant] = (
            f"CASE {' '.join(branches)} END" if branches else "CAST(NULL AS INT)"
        )
    top = max(builder.stages, default=-1)
    stages = [list(builder.stages.get(level, {}).values()) for level in range(top + 1)]
    return Compiled(stages, values)
