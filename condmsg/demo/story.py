"""The demo's narration: one line per thing that happened, timed from its CM's ``sent_at``.

Lines come from several threads (receiver processes' readers, the outcome listener, the
script), so printing is serialized. Times are in the scenario's unit: days for Example 1
(scaled to seconds), seconds for Example 2.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from condmsg.core.outcome import Outcome, SphereOutcome
from condmsg.core.protocol import parse_instant
from condmsg.core.timeutil import utcnow


@dataclass(frozen=True, slots=True)
class Clock:
    """How a CM's times are shown: ``sent_at`` is +0, one ``unit_s`` is one ``suffix``."""

    sent_at: datetime
    unit_s: float
    suffix: str
    label: str

    def offset(self, at: datetime) -> str:
        value = (at - self.sent_at).total_seconds() / self.unit_s
        return f"{value:+.2f}{self.suffix}"


class Story:
    """``prefix`` is left out of queue names in the outcome reasons it tells."""

    def __init__(self, prefix: str = "") -> None:
        self.prefix = prefix
        self._lock = threading.Lock()
        self._clocks: dict[str, Clock] = {}
        self.current: Clock | None = None

    def register(self, cm_id: str, clock: Clock) -> None:
        with self._lock:
            self._clocks[cm_id] = clock
            self.current = clock

    def clock(self, cm_id: str | None) -> Clock | None:
        with self._lock:
            return self._clocks.get(cm_id or "", self.current)

    def when(self, cm_id: str | None, at: datetime | None = None) -> str:
        clock = self.clock(cm_id)
        return clock.offset(at or utcnow()) if clock else ""

    def line(self, when: str, who: str, text: str, detail: tuple[str, ...] = ()) -> None:
        with self._lock:
            print(f"  {when:>8}  {who:<20} {text}", flush=True)
            for item in detail:
                print(f"  {'':>8}  {'':<20}   {item}", flush=True)

    def say(self, text: str = "") -> None:
        with self._lock:
            print(text, flush=True)

    # -- what the participants report ------------------------------------------------------

    def receiver_event(self, who: str, event: dict[str, Any]) -> None:
        kind, cm_id = event.get("kind"), event.get("cm_id")
        clock = self.clock(cm_id)
        what = clock.label if clock else "it"
        read_at = parse_instant(event["read_at"], "read_at") if "read_at" in event else None
        if event["event"] == "taken":
            text = f"took the {what} in a transaction; still processing it, not committed"
            self.line(self.when(cm_id, read_at), who, text)
        elif event["event"] == "got" and kind == "original":
            if event["transactional"]:
                committed = parse_instant(event["committed_at"], "committed_at")
                text = f"read and committed the {what} ({self.when(cm_id, read_at)}): COMMIT ack"
                self.line(self.when(cm_id, committed), who, text)
            else:
                text = f"read the {what} without a transaction: READ ack"
                self.line(self.when(cm_id, read_at), who, text)
        elif event["event"] == "got" and kind == "compensation":
            text = f"got the compensation {event['payload']!r}"
            self.line(self.when(cm_id, read_at), who, text)
        elif event["event"] == "got" and kind == "success":
            self.line(self.when(cm_id, read_at), who, "got the success notice")
        elif event["event"] == "got":
            self.line(self.when(cm_id, read_at), who, f"got a {kind} message")

    def cancelled_out(self, who: str, cancelled: int, discards: int) -> None:
        text = (
            f"receiver log: compensation cancelled ({cancelled}) and original discarded "
            f"({discards}); the app got neither"
        )
        self.line(self.when(None), who, text)

    def outcome(self, outcome: Outcome) -> None:
        clock = self.clock(outcome.cm_id)
        decided = clock.offset(outcome.decided_at) if clock else ""
        what = f" of the {clock.label}" if clock else ""
        text = f"outcome{what} arrived: {outcome.verdict.value.upper()} (decided {decided})"
        reasons = tuple(r.replace(self.prefix, "") for r in outcome.reasons)
        self.line(self.when(outcome.cm_id), "sender", text, reasons)

    def sphere_outcome(self, outcome: SphereOutcome) -> None:
        clock = self.clock(outcome.sphere_id)
        decided = clock.offset(outcome.decided_at) if clock else ""
        text = f"outcome of the sphere arrived: {outcome.verdict.value.upper()} (decided {decided})"
        members = ", ".join(f"{cm[:8]} {state}" for cm, state in outcome.members.items())
        reasons = (*(r.replace(self.prefix, "") for r in outcome.reasons), f"members: {members}")
        self.line(self.when(outcome.sphere_id), "sender", text, reasons)
