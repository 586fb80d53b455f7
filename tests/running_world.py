"""A sender and a running evaluator on one PostgreSQL schema, time scaled: the world that
tests of the whole loop (the evaluator's flow, Dependency-Spheres, the audit of a real run)
set their receivers and sends in. The ``running_world`` fixture (tests/conftest.py) starts
one per test and stops it afterwards."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from evaluator.config import EvaluatorConfig
from evaluator.service import Evaluator

#: A wait for the last needed ack short enough that a test decides in a blink, and sweeps
#: often enough that a deadline of a scaled day (a second) is seen at once.
ACK_GRACE = timedelta(milliseconds=100)
SWEEP_INTERVAL_S = 0.1


@dataclass
class RunningWorld:
    sender: Any  # condmsg.Sender
    evaluator: Evaluator
    #: The sender's name (the test's unique name, with dashes for dots).
    name: str
    pg_url: str
    #: The test's unique name: its queues are named ``{prefix}.{short}``.
    prefix: str

    @classmethod
    def start(
        cls,
        sender: Any,
        pg_url: str,
        prefix: str,
        secret: bytes,
        *,
        sweep_interval_s: float = SWEEP_INTERVAL_S,
    ) -> RunningWorld:
        """Start the evaluator of ``sender`` (its store at ``pg_url``, its broker the
        sender's) and name the test's queues after ``prefix``."""
        evaluator = Evaluator(
            EvaluatorConfig(
                amqp_url=sender.amqp_url,
                sender=sender.name,
                db_url=pg_url,
                secret=secret,
                ack_grace=ACK_GRACE,
                sweep_interval_s=sweep_interval_s,
            )
        ).start()
        return cls(sender, evaluator, sender.name, pg_url, prefix)

    def queue(self, short: str) -> str:
        return f"{self.prefix}.{short}"

    def stop(self) -> None:
        """Stop the evaluator (again: a test that must see it stopped before it looks at the
        store stops it itself)."""
        self.evaluator.stop()
        self.evaluator.engine.dispose()
