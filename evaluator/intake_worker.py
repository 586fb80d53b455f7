"""An intake worker process: an intake-only evaluator started by the service's
:class:`evaluator.workers.IntakeWorkers` (``WORKER_COMMAND``).

Its configuration is the first line of its stdin; end of file on stdin, SIGTERM or SIGINT
make it finish the batches in hand and exit. It writes what each stored batch did as one
JSON line on its stdout, which the service adds to its own metrics. This module is apart
from :mod:`evaluator.workers` because it builds an :class:`Evaluator`, whose service starts
the workers: the service imports the launcher, the worker imports the service.
"""

from __future__ import annotations

import json
import logging
import sys
import threading
from datetime import timedelta
from typing import IO, Any

from condmsg.core.errors import ConfigError
from condmsg.runtime.logging_setup import configure_logging
from condmsg.runtime.stopping import StopSignals
from evaluator.config import EvaluatorConfig
from evaluator.service import Evaluator
from evaluator.workers import WorkerConfig

log = logging.getLogger(__name__)


class _Reporter:
    """Writes one report line per stored batch to the service (from any storing thread).
    Once the service has gone (a broken pipe) it writes nothing more: the worker's leash
    sees the end of its stdin and stops it."""

    def __init__(self, out: IO[str]) -> None:
        self._out = out
        self._lock = threading.Lock()
        self._broken = False

    def __call__(self, report: dict[str, Any]) -> None:
        line = json.dumps(report, separators=(",", ":")) + "\n"
        with self._lock:
            if self._broken:
                return
            try:
                self._out.write(line)
                self._out.flush()
            except (OSError, ValueError):
                self._broken = True


def main() -> int:
    """A worker process: an intake-only evaluator until stdin closes or a signal comes."""
    line = sys.stdin.readline()
    if not line:
        return 0  # the service went away before saying anything
    config = WorkerConfig(**json.loads(line))
    # As the service logs (its lines and its workers' share its stderr).
    configure_logging(config.log_level, config.log_format)

    done = StopSignals().install().event

    def leash() -> None:
        sys.stdin.read()  # until the service closes it or dies
        done.set()

    service = Evaluator(
        EvaluatorConfig(
            amqp_url=config.amqp_url,
            db_url=config.db_url,
            sender=config.sender,
            secret=bytes.fromhex(config.secret_hex),
            ack_grace=timedelta(milliseconds=config.ack_grace_ms),
            clock_skew=timedelta(milliseconds=config.clock_skew_ms),
            batch_size=config.batch_size,
            prefetch=config.prefetch,
            store_threads=config.store_threads,
            relay=False,
            sweeps=False,
            instance=config.instance,
            freeze_gc=True,  # a process of its own
            create=False,  # the service made the store; a wrong URL must not make another
        ),
        report=_Reporter(sys.stdout),
    )
    threading.Thread(target=leash, name="evaluator-worker-leash", daemon=True).start()
    try:
        if not service.wait_until_prepared(done):
            return 0
    except ConfigError as exc:
        log.error("the intake worker cannot start: %s", exc)
        return 1
    service.start()
    log.info("intake worker %s for sender %s started", config.instance, config.sender)
    while not done.wait(1.0):
        if not service.running:  # its thread died: exit, and the service starts another
            log.error("the intake worker's service thread ended; exiting")
            return 1
    service.stop()
    return 0
