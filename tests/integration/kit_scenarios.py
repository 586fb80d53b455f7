"""Random scripted scenarios for the test kit's fidelity test, and how the kit plays them.

A scenario is one CM (a random condition over one to three destinations, a compensation
or none, success notices or none) and, per destination, a plan of what its receiver does
and when: nothing, a read, a transactional read committed at once or some time later, a
rolled-back read read again later, or a receiver that crashes inside its transaction, is
away for a while and reads the message again when it is back. Times are in *units* after
the send. Deadlines fall on even units and the scripted events on half units, each of a
scenario's events on a slot of its own: so an event is half a unit from any deadline and
from any other event of its scenario, which is what lets the real services, whose events
happen a few milliseconds off their script, reach the same outcome as the kit, where they
happen on the dot.

What is compared (:class:`Result`): the verdict, the reasons (instants taken out: they
depend on when the CM was sent), and per destination the kinds of message its application
got, in order (originals, compensations, success notices), including a last drain of
every queue once every CM is decided.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from condmsg.core.conditions import Condition, Destination, DestinationSet
from condmsg.core.errors import ConditionError
from condmsg.testing import Kit, KitReceiver, KitTransaction

#: Deadlines, in units after the send.
DURATIONS = (2, 4, 6)
#: Event slots, in units after the send: half a unit from every deadline.
SLOTS = tuple(k + 0.5 for k in range(7))
#: When every queue is drained (every CM is decided by the last deadline plus the grace).
DRAIN_AT = 7.5
#: A scenario's span, in units.
SPAN = 8.0


@dataclass(frozen=True, slots=True)
class Plan:
    """What the receiver of one destination does: ``kind`` and its instants (units).

    - ``none``: nothing (until the drain);
    - ``read`` (at): a non-transactional read;
    - ``commit`` (at): a transactional read, committed at once;
    - ``slow`` (at, commit): a transactional read, committed later;
    - ``rollback`` (at, again): a transactional read rolled back, read again and committed;
    - ``crash`` (at, away, again): a transactional read, then the receiver crashes (its
      transaction is lost, the message goes back), is away, and reads it again when back.
    """

    kind: str
    times: tuple[float, ...] = ()

    @property
    def holds_a_transaction(self) -> bool:
        """Whether a transaction stays open across time (the kit gives such a plan a
        receiver, and so a store, of its own: SQLite holds a write lock meanwhile)."""
        return self.kind in ("slow", "crash")


@dataclass(frozen=True, slots=True)
class Scenario:
    index: int
    condition: Condition
    #: The destinations' names in the condition (``d0``...); a world maps them to queues.
    destinations: tuple[str, ...]
    plans: tuple[Plan, ...]
    compensation: bytes | None
    notify_success: bool

    def condition_for(self, queue: Callable[[str], str]) -> Condition:
        return _renamed(self.condition, queue)


@dataclass(slots=True)
class Result:
    verdict: str
    reasons: tuple[str, ...]
    #: Per destination (``d0``...), the kinds of message its application got, in order.
    got: dict[str, list[str]] = field(default_factory=dict)
    #: When it was decided, in units after the send (not compared: the real side's
    #: decisions come a little later than the kit's; how much later says whether a
    #: difference can be blamed on the kit).
    decided_after: float | None = field(default=None, compare=False)


_INSTANT = re.compile(r"\d{4}-\d\d-\d\dT[\d:.]+Z")


def normal_reasons(
    reasons: tuple[str, ...] | list[str], queue: Callable[[str], str]
) -> tuple[str, ...]:
    """``reasons`` without instants, with the world's queue names back to ``d0``..."""
    names = {queue(f"d{i}"): f"d{i}" for i in range(3)}
    out = []
    for reason in reasons:
        text = _INSTANT.sub("<t>", reason)
        # Longest first: a world's ``x.p1`` must not be replaced inside its ``x.p16``.
        for real, plain in sorted(names.items(), key=lambda item: -len(item[0])):
            text = text.replace(real, plain)
        out.append(text)
    return tuple(out)


# -- generating ---------------------------------------------------------------------------


def scenarios(seed: int, count: int) -> list[Scenario]:
    rng = random.Random(seed)
    return [_scenario(rng, i) for i in range(count)]


def _scenario(rng: random.Random, index: int) -> Scenario:
    n = rng.choice((1, 2, 2, 3, 3))
    names = tuple(f"d{i}" for i in range(n))
    condition = _condition(rng, names)
    free = list(SLOTS)
    rng.shuffle(free)
    plans = tuple(_plan(rng, free) for _ in names)
    return Scenario(
        index=index,
        condition=condition,
        destinations=names,
        plans=plans,
        compensation=rng.choice((None, b"undo")),
        notify_success=rng.random() < 0.5,
    )


def _condition(rng: random.Random, names: tuple[str, ...]) -> Condition:
    unit = timedelta(seconds=1)  # durations are in units; a world scales them

    def constraint() -> dict[str, Any]:
        found: dict[str, Any] = {}
        if rng.random() < 0.5:
            found["pickup_within"] = rng.choice(DURATIONS) * unit
        if rng.random() < 0.5:
            found["process_within"] = rng.choice(DURATIONS) * unit
        return found

    while True:
        try:
            if len(names) == 1:
                root: Condition = Destination(
                    names[0], **(constraint() or {"pickup_within": 4 * unit})
                )
            else:
                members = [
                    Destination(name, **(constraint() if rng.random() < 0.3 else {}))
                    for name in names
                ]
                options = constraint()
                if "pickup_within" in options and rng.random() < 0.5:
                    options["min_pickup"] = rng.randint(1, len(names))
                if "process_within" in options and rng.random() < 0.5:
                    options["min_process"] = rng.randint(1, len(names))
                root = DestinationSet(*members, **options)
            if rng.random() < 0.3:
                window = root.evaluation_window()
                if window < 6 * unit:
                    root = _with_timeout(root, 6 * unit)
            root.validate()
            return root
        except ConditionError:
            continue


def _with_timeout(root: Condition, timeout: timedelta) -> Condition:
    if isinstance(root, Destination):
        return Destination(root.name, **_attrs(root), evaluation_timeout=timeout)
    assert isinstance(root, DestinationSet)
    return DestinationSet(*root.members, **_attrs(root), evaluation_timeout=timeout)


def _attrs(node: Condition) -> dict[str, Any]:
    keys = (
        "pickup_within",
        "process_within",
        "min_pickup",
        "max_pickup",
        "min_process",
        "max_process",
    )
    return {k: getattr(node, k) for k in keys if getattr(node, k) is not None}


def _renamed(node: Condition, queue: Callable[[str], str]) -> Condition:
    extra = (
        {} if node.evaluation_timeout is None else {"evaluation_timeout": node.evaluation_timeout}
    )
    if isinstance(node, Destination):
        return Destination(queue(node.name), **_attrs(node), **extra)
    assert isinstance(node, DestinationSet)
    return DestinationSet(*(_renamed(m, queue) for m in node.members), **_attrs(node), **extra)


def _take(free: list[float], *wanted: float) -> bool:
    if all(t in free for t in wanted):
        for t in wanted:
            free.remove(t)
        return True
    return False


def _plan(rng: random.Random, free: list[float]) -> Plan:
    kind = rng.choices(("none", "read", "commit", "slow", "rollback", "crash"), (2, 3, 4, 2, 1, 1))[
        0
    ]
    if kind == "none" or not free:
        return Plan("none")
    at = free[0]
    if kind in ("read", "commit"):
        _take(free, at)
        return Plan(kind, (at,))
    if kind == "slow":
        commit = at + rng.choice((1, 2))
        if _take(free, at, commit):
            return Plan("slow", (at, commit))
    if kind == "rollback" and _take(free, at, at + 1):
        return Plan("rollback", (at, at + 1))
    if kind == "crash" and _take(free, at, at + 1, at + 2):
        return Plan("crash", (at, at + 1, at + 2))
    _take(free, at)
    return Plan("commit", (at,))


# -- the scaled condition --------------------------------------------------------------


def scaled(condition: Condition, unit: timedelta) -> Condition:
    """``condition`` with its durations (in seconds standing for units) times ``unit``."""
    factor = unit / timedelta(seconds=1)

    def scale(node: Condition) -> Condition:
        attrs = {
            k: (v * factor if isinstance(v, timedelta) else v) for k, v in _attrs(node).items()
        }
        if node.evaluation_timeout is not None:
            attrs["evaluation_timeout"] = node.evaluation_timeout * factor
        if isinstance(node, Destination):
            return Destination(node.name, **attrs)
        assert isinstance(node, DestinationSet)
        return DestinationSet(*(scale(m) for m in node.members), **attrs)

    return scale(condition)


# -- the kit's side -------------------------------------------------------------------------

#: The unit in the kit (any will do: its time is virtual).
KIT_UNIT = timedelta(seconds=1)


class KitWorld:
    """Scenarios played in one kit, all sent at its start: their destinations are queues
    of their own (``s<index>.d<i>``). Destinations whose plan holds a transaction open get
    a receiver of their own; the others share one."""

    def __init__(self, kit: Kit, batch: list[Scenario]) -> None:
        self.kit = kit
        self.batch = batch
        self.cm_ids: dict[int, str] = {}
        self.readers: dict[tuple[int, str], KitReceiver] = {}
        self._open: dict[
            tuple[int, str], tuple[AbstractContextManager[KitTransaction], KitTransaction]
        ] = {}
        shared = kit.receiver("shared", **RETRY)
        # A plan that holds a transaction open gets a receiver that no other destination
        # uses while the transaction is open: (receiver, the slot after which it is free).
        holders: list[list[Any]] = []
        spans = []
        for s in batch:
            for name, plan in zip(s.destinations, s.plans, strict=True):
                if plan.holds_a_transaction:
                    spans.append((plan.times[0], plan.times[-1], s.index, name))
                else:
                    self.readers[(s.index, name)] = shared
        for first, last, index, name in sorted(spans):
            holder = next((h for h in holders if h[1] < first), None)
            if holder is None:
                holder = [kit.receiver(f"holder-{len(holders)}", **RETRY), last]
                holders.append(holder)
            holder[1] = last
            self.readers[(index, name)] = holder[0]

    @staticmethod
    def queue(index: int) -> Callable[[str], str]:
        return lambda name: f"s{index}.{name}"

    def play(self) -> dict[int, Result]:
        kit = self.kit
        start = self.sent_at = kit.now()
        with kit.together():
            for s in self.batch:
                self.cm_ids[s.index] = kit.send(
                    b"payload",
                    scaled(s.condition_for(self.queue(s.index)), KIT_UNIT),
                    compensation=s.compensation,
                    notify_success=s.notify_success,
                )
        for slot in SLOTS:
            kit.advance_to(start + slot * KIT_UNIT)
            # The scenarios are independent: their events of one instant happen as one.
            with kit.together():
                for s in self.batch:
                    for name, plan in zip(s.destinations, s.plans, strict=True):
                        if slot in plan.times:
                            self._step(s.index, name, plan, plan.times.index(slot))
        kit.advance_to(start + DRAIN_AT * KIT_UNIT)
        with kit.together():
            for s in self.batch:
                for name in s.destinations:
                    reader = self.readers[(s.index, name)]
                    while self._commit_one(reader, self.queue(s.index)(name)) is not None:
                        pass
        return {s.index: self._result(s) for s in self.batch}

    def _step(self, index: int, name: str, plan: Plan, step: int) -> None:
        reader = self.readers[(index, name)]
        queue = self.queue(index)(name)
        key = (index, name)
        kind = plan.kind
        if kind == "read":
            reader.read(queue)
        elif (
            kind == "commit"
            or (kind == "rollback" and step == 1)
            or (kind == "crash" and step == 2)
        ):
            self._commit_one(reader, queue)
        elif kind == "rollback":
            try:
                with reader.transaction() as tx:
                    tx.read(queue)
                    raise _RolledBack
            except _RolledBack:
                pass
        elif step == 0:  # slow or crash: a transaction that stays open
            scope = reader.transaction()
            tx = scope.__enter__()
            tx.read(queue)
            self._open[key] = (scope, tx)
        elif kind == "slow":
            scope, _ = self._open.pop(key)
            scope.__exit__(None, None, None)
        else:  # crash: the process goes; its transaction never commits
            scope, _ = self._open.pop(key)
            reader.go_away()
            scope.__exit__(_RolledBack, _RolledBack(), None)
            reader.come_back()

    @staticmethod
    def _commit_one(reader: KitReceiver, queue: str) -> Any:
        with reader.transaction() as tx:
            return tx.read(queue)

    def _result(self, s: Scenario) -> Result:
        outcome = self.kit.outcome(self.cm_ids[s.index])
        queue = self.queue(s.index)
        if outcome is None:
            result = Result("pending", ())
        else:
            result = Result(outcome.verdict.value, normal_reasons(outcome.reasons, queue))
            result.decided_after = (outcome.decided_at - self.sent_at) / KIT_UNIT
        for name in s.destinations:
            reader = self.readers[(s.index, name)]
            result.got[name] = [str(m.kind) for m in reader.messages if m.queue == queue(name)]
        return result


class _RolledBack(Exception):
    """Raised inside a scripted transaction to roll it back."""


def play_in_kit(
    all_scenarios: list[Scenario], batch_size: int = 250
) -> Iterator[tuple[int, Result]]:
    """Every scenario's result in the kit, ``batch_size`` scenarios per kit."""
    for first in range(0, len(all_scenarios), batch_size):
        with Kit(sender="diff", ack_grace=ACK_GRACE) as kit:
            yield from KitWorld(kit, all_scenarios[first : first + batch_size]).play().items()


#: The evaluator's ack grace on both sides: every ack is half a unit from a deadline.
ACK_GRACE = timedelta(milliseconds=100)
#: The receivers' retry pause on both sides (the services' would hold a rolled-back
#: message on the consumer that rolled it back, which the scenarios do not script).
RETRY = {"retry_backoff": timedelta(0), "retry_backoff_max": timedelta(0)}
