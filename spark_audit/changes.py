"""The what-if change language: validated edits of recorded conditions (pure; no Spark).

A change is one short text (``docs/audit.md``, *What-if replay*):

* ``pickup=2h``, ``process*=1.5``, ``timeout=30m``: set (``=``) or scale (``*=``) a
  deadline. Without a target, every node that has that deadline; ``@root`` the root;
  ``@NAME`` the destination ``NAME`` (given one where it has none). ``timeout`` is the
  root's evaluation timeout (scaling it scales the evaluation window, explicit or not).
* ``min_process=2``, ``max_pickup@root=3``: set a count: without a target on every node
  that has that count, else on the root or the destination named.
* ``since=2026-11-01``, ``until=...``, ``sender=NAME``, ``destination=NAME``: only CMs
  sent in the window, by that sender, or whose condition names that destination.

:func:`parse_changes` checks the text; :meth:`ChangeSet.apply` edits one condition (the
caller runs it once per *distinct* condition) and re-validates the result with the
condition model, so an impossible result (a count above the members, a deadline past
100 years) is a :class:`~condmsg.core.errors.ConditionError` naming the change and the node.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from condmsg.core.condition_codec import condition_from_dict, condition_to_dict
from condmsg.core.conditions import MAX_COUNT, MAX_DURATION, Condition
from condmsg.core.errors import ConditionError, ConfigError
from condmsg.core.timeutil import parse_cli_instant, to_ms

DEADLINES = {
    "pickup": "pickup_within_ms",
    "process": "process_within_ms",
    "timeout": "evaluation_timeout_ms",
}
COUNTS = ("min_pickup", "max_pickup", "min_process", "max_process")
FILTERS = ("since", "until", "sender", "destination")
_UNITS = {"ms": 1, "s": 1000, "m": 60_000, "min": 60_000, "h": 3_600_000, "d": 86_400_000}
_SYNTAX = re.compile(r"^\s*([a-z_]+)(?:@([^=*]+))?\s*(\*?=)\s*(.+?)\s*$")
_DURATION = re.compile(r"^(\d+(?:\.\d+)?)\s*(ms|s|min|m|h|d)?$")


def parse_duration_ms(text: str) -> int:
    """``15m``, ``2h``, ``1.5d``, ``500ms``, ``30s`` or plain milliseconds -> ms (> 0)."""
    match = _DURATION.match(text.strip())
    if match is None:
        raise ValueError(f"expected a duration like 90s, 15m, 2h or 3d, got {text!r}")
    ms = round(float(match[1]) * _UNITS[match[2] or "ms"])
    if ms <= 0:
        raise ValueError(f"a deadline must be positive, got {text!r}")
    if ms > to_ms(MAX_DURATION):
        raise ValueError(f"a deadline must be at most 36525d, got {text!r}")
    return ms


@dataclass(frozen=True, slots=True, kw_only=True)
class Change:
    """One edit: ``field`` (a deadline key of :data:`DEADLINES` or a count of
    :data:`COUNTS`), its ``target`` (None: every node that has it; ``root``; a destination
    name), and either ``value`` (ms or a count) or ``factor``."""

    text: str
    field: str
    target: str | None
    value: int | None = None
    factor: float | None = None

    def _new(self, old: int | None) -> int | None:
        if self.factor is None:
            return self.value
        return None if old is None else max(1, round(old * self.factor))

    def _nodes(self, root: dict[str, Any]) -> Iterator[dict[str, Any]]:
        if self.target == "root":
            yield root
            return
        key = DEADLINES.get(self.field, self.field)
        stack = [root]
        while stack:
            node = stack.pop()
            stack.extend(node.get("members", ()))
            wanted = key in node if self.target is None else node.get("name") == self.target
            if wanted:
                yield node

    def apply(self, root: dict[str, Any], window_ms: int) -> None:
        """Edit the condition dict ``root`` in place."""
        key = DEADLINES.get(self.field, self.field)
        if self.field == "timeout":
            root[key] = self._new(root.get(key, window_ms))
            return
        for node in self._nodes(root):
            new = self._new(node.get(key))
            if new is not None:
                node[key] = new


@dataclass(frozen=True, slots=True, kw_only=True)
class Selection:
    """Which CMs a what-if judges (every decided CM when all are None)."""

    since: datetime | None = None
    until: datetime | None = None
    senders: tuple[str, ...] = ()
    destinations: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class ChangeSet:
    """Changes applied in order, and the CMs they apply to."""

    changes: tuple[Change, ...]
    selection: Selection = field(default_factory=Selection)

    @property
    def text(self) -> str:
        return " ".join(c.text for c in self.changes) or "(no change)"

    def apply(self, condition: Condition) -> Condition:
        """``condition`` changed; raises :class:`ConditionError` naming the change that
        cannot apply (its target missing, or the result invalid)."""
        document = condition_to_dict(condition)
        root = document["condition"]
        window_ms = to_ms(condition.evaluation_window())
        # A change aimed at a destination leaves the conditions without it as they are.
        for change in self.changes:
            change.apply(root, window_ms)
        _keep_timeout_margin(root, condition, self.changes)
        try:
            return condition_from_dict(document)
        except ConditionError as exc:
            raise ConditionError(f"change {self.text!r}: {exc}") from None


def _deadlines_ms(node: dict[str, Any]) -> Iterator[int]:
    for key in ("pickup_within_ms", "process_within_ms"):
        if key in node:
            yield node[key]
    for member in node.get("members", ()):
        yield from _deadlines_ms(member)


def _keep_timeout_margin(
    root: dict[str, Any], original: Condition, changes: Iterable[Change]
) -> None:
    """An explicit evaluation timeout the changes did not set keeps its margin over the
    latest deadline: a later deadline would otherwise be cut off (an invalid condition),
    and the margin is the ack grace its sender chose (the paper's 20 s pickup, 21 s)."""
    key = DEADLINES["timeout"]
    if key not in root or any(c.field == "timeout" for c in changes):
        return
    latest = max(_deadlines_ms(root), default=0)
    if latest > root[key]:
        old_latest = max((to_ms(d) for d in original.deadlines()), default=0)
        root[key] = latest + max(0, root[key] - old_latest)


def parse_change(text: str) -> Change | tuple[str, str]:
    """One change, or a filter ``(name, value)``; :class:`ConfigError` naming the text."""
    match = _SYNTAX.match(text)
    if match is None:
        raise ConfigError(
            f"change {text!r}: expected FIELD[@TARGET]=VALUE or FIELD[@TARGET]*=FACTOR "
            "(e.g. pickup=2h, process@qr3*=0.5, min_process=2, sender=app)"
        )
    name, target, operator, value = match[1], match[2], match[3], match[4]
    target = target.strip() if target else None
    try:
        if name in FILTERS:
            if target is not None or operator != "=":
                raise ValueError(f"a filter takes {name}=VALUE")
            if name in ("since", "until"):
                parse_cli_instant(value)
            return name, value
        if name == "timeout" and target not in (None, "root"):
            raise ValueError("the evaluation timeout is the root's: no @TARGET")
        if operator == "*=":
            if name not in DEADLINES:
                raise ValueError("only deadlines scale (pickup, process, timeout)")
            factor = float(value)
            if not 0 < factor < 1e6:
                raise ValueError(f"a factor must be positive, got {value!r}")
            return Change(text=text.strip(), field=name, target=target, factor=factor)
        if name in DEADLINES:
            ms = parse_duration_ms(value)
            return Change(text=text.strip(), field=name, target=target, value=ms)
        if name in COUNTS:
            if not value.isdigit() or int(value) > MAX_COUNT:
                raise ValueError(f"a count is a whole number from 0 to {MAX_COUNT}, got {value!r}")
            return Change(text=text.strip(), field=name, target=target, value=int(value))
        raise ValueError(
            f"unknown field {name!r}: one of {', '.join([*DEADLINES, *COUNTS, *FILTERS])}"
        )
    except ValueError as exc:
        raise ConfigError(f"change {text!r}: {exc}") from None


def parse_changes(texts: Iterable[str | Change]) -> ChangeSet:
    """The :class:`ChangeSet` of ``texts`` (changes and filters, in order)."""
    changes: list[Change] = []
    filters: dict[str, list[str]] = {name: [] for name in FILTERS}
    for text in texts:
        parsed = text if isinstance(text, Change) else parse_change(text)
        if isinstance(parsed, Change):
            changes.append(parsed)
        else:
            filters[parsed[0]].append(parsed[1])
    for name in ("since", "until"):
        if len(filters[name]) > 1:
            raise ConfigError(f"change {name}: given {len(filters[name])} times")
    since, until = (
        parse_cli_instant(filters[n][0]) if filters[n] else None for n in ("since", "until")
    )
    if since is not None and until is not None and since >= until:
        raise ConfigError(f"change since={filters['since'][0]}: not before until")
    selection = Selection(
        since=since,
        until=until,
        senders=tuple(filters["sender"]),
        destinations=tuple(filters["destination"]),
    )
    return ChangeSet(tuple(changes), selection)


def sweep_changes(parameter: str, values: Iterable[str]) -> list[Change]:
    """One change per grid value: ``pickup`` with ``["15m", "1h"]`` -> ``pickup=15m``, ...
    (``parameter`` may carry a target: ``process@qr3``)."""
    found = []
    for value in values:
        parsed = parse_change(f"{parameter}={value}")
        if not isinstance(parsed, Change):
            raise ConfigError(f"sweep {parameter!r}: a filter cannot be swept")
        found.append(parsed)
    if not found:
        raise ConfigError(f"sweep {parameter!r}: no values")
    return found
