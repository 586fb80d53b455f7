"""What a demo scenario works with: the sender, the receivers, the outcomes, the story, and
the checks that make the demo fail when something differs from the paper's examples."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime

import sqlalchemy as sa

from condmsg import tables
from condmsg.core.outcome import Outcome
from condmsg.demo.agents import OutcomeListener, RxProcess
from condmsg.demo.setup import DemoError, Names, wait_for
from condmsg.demo.story import Story
from condmsg.sending.sender import Sender


@dataclass
class Checks:
    """Expectations: each is printed as it is judged; the failed ones make the exit code."""

    story: Story
    failed: list[str] = field(default_factory=list)
    passed: int = 0

    def expect(self, ok: bool, text: str) -> bool:
        self.story.say(f"  {'✓' if ok else '✗'} {text}")
        if ok:
            self.passed += 1
        else:
            self.failed.append(text)
        return ok


@dataclass
class Stage:
    names: Names
    amqp_url: str
    sender: Sender
    story: Story
    outcomes: OutcomeListener
    receivers: dict[str, RxProcess]
    controllers: list[RxProcess]
    checks: Checks
    #: Seconds per day of Example 1.
    day_s: float
    #: The facilities' database (a schema), where the spheres book rooms.
    facilities_url: str

    def sent_at(self, cm_id: str) -> datetime:
        with self.sender.engine.connect() as conn:
            value = conn.execute(
                sa.select(tables.cms.c.sent_at).where(tables.cms.c.cm_id == cm_id)
            ).scalar_one()
        sent_at: datetime = value if value.tzinfo else value.replace(tzinfo=UTC)  # SQLite: naive
        return sent_at

    def wait_outcome(self, cm_id: str, timeout: float) -> Outcome:
        """The outcome notification, as it arrived on the sender's outcome queue."""
        found = wait_for(lambda: self.outcomes.get(cm_id), timeout, f"the outcome of {cm_id}")
        assert found is not None  # wait_for returns only a truthy value
        return found

    def settle(self, predicate: Callable[[], object], timeout: float) -> bool:
        """Wait until ``predicate`` holds; False after ``timeout`` s (the checks then say
        what differs)."""
        try:
            wait_for(predicate, timeout, "")
        except DemoError:
            return False
        return True

    def ack_statuses(self, cm_id: str, destination: str) -> list[str]:
        """How the evaluator filed the acks of ``destination`` for ``cm_id``."""
        query = sa.select(tables.acks.c.status).where(
            tables.acks.c.cm_id == cm_id, tables.acks.c.destination == destination
        )
        with self.sender.engine.connect() as conn:
            return [str(s) for s in conn.execute(query).scalars()]


def sleep_until(start: float, offset_s: float) -> None:
    """Follow the scenario's script: the next step happens ``offset_s`` after ``start``
    (``time.monotonic()``). A timeline, not a wait for a condition."""
    delay = start + offset_s - time.monotonic()
    if delay > 0:
        time.sleep(delay)
