"""Intake processes: more evaluator instances on the service's ack queue, run by the service.

One interpreter runs an evaluator's consuming and storing threads under one interpreter
lock, so on a machine with more cores than that one lock can use, the intake is bound by
it (``docs/evaluator.md``). With ``intake_processes=N`` the service starts ``N - 1``
worker processes (:mod:`evaluator.intake_worker`, in a new interpreter). Each is an
intake-only evaluator instance on the same ack queue and database, with its own broker and
database connections: several instances are what the design already allows (the broker shares
the deliveries out; decisions are conditional updates, rows are locked in id order), so
a worker needs nothing new to be correct.

The service keeps everything else: the deadline sweeps, retention, the relay that
publishes the workers' outcome rows (they commit them to the same outbox) and the
metrics. A worker writes what each batch did as one JSON line on its stdout, and the
service adds it to its own metrics (:meth:`EvaluatorMetrics.observe_report`).

A worker's stdin is its leash: its configuration comes as the first line (the secret
and the database password stay off the command line), and end of file, when the service
stops or dies, makes it finish the batches in hand and exit. SIGTERM or SIGINT do the
same. A worker that exits while the service runs is started again, after a pause that
doubles up to :data:`MAX_RESTART_DELAY_S`; its unacknowledged deliveries went back to
the queue when its connection closed.
"""

from __future__ import annotations

import contextlib
import json
import logging
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import IO, Any

from condmsg.infra.backoff import Backoff
from condmsg.runtime.settings import DEFAULT_CLOCK_SKEW

log = logging.getLogger(__name__)

FIRST_RESTART_DELAY_S = 1.0
MAX_RESTART_DELAY_S = 30.0
#: A worker that ran this long before exiting is restarted after the first delay again.
STEADY_S = 60.0


#: A worker process (``-c`` rather than ``-m``: the module is imported with its package).
WORKER_COMMAND = (
    sys.executable,
    "-c",
    "import sys; from evaluator.intake_worker import main; sys.exit(main())",
)


@dataclass(frozen=True, slots=True)
class WorkerConfig:
    """What a worker needs to be an intake-only copy of its service (one JSON line)."""

    amqp_url: str = field(repr=False)
    db_url: str = field(repr=False)
    sender: str
    secret_hex: str = field(repr=False)
    ack_grace_ms: float
    batch_size: int
    prefetch: int
    store_threads: int
    instance: str
    clock_skew_ms: float = DEFAULT_CLOCK_SKEW.total_seconds() * 1000
    #: The service's logging, which its workers' lines follow (None: the environment's).
    log_level: str | None = None
    log_format: str | None = None


class IntakeWorkers:
    """Starts ``count`` worker processes, restarts those that exit, stops them all."""

    def __init__(
        self,
        count: int,
        config: WorkerConfig,
        on_report: Callable[[dict[str, Any]], None],
        *,
        command: tuple[str, ...] = WORKER_COMMAND,
    ) -> None:
        self.count = count
        self.config = config
        self.on_report = on_report
        self.command = command
        self.started = 0  # processes started, restarts included
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._procs: dict[int, subprocess.Popen[str]] = {}
        self._threads: list[threading.Thread] = []

    def start(self) -> None:
        for index in range(self.count):
            thread = threading.Thread(
                target=self._supervise,
                args=(index,),
                name=f"evaluator-worker-{self.config.sender}-{index + 1}",
                daemon=True,
            )
            self._threads.append(thread)
            thread.start()

    def pids(self) -> list[int]:
        with self._lock:
            return [proc.pid for proc in self._procs.values() if proc.poll() is None]

    def stop(self, timeout_s: float = 10.0) -> None:
        """Close every worker's stdin (each finishes its batches and exits); kill those
        still running after ``timeout_s``."""
        with self._lock:
            self._stopping.set()
            procs = list(self._procs.values())
        for proc in procs:
            _close(proc.stdin)
        deadline = time.monotonic() + timeout_s
        for proc in procs:
            try:
                proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.warning("intake worker %d did not stop in time; killed", proc.pid)
                proc.kill()
                proc.wait()
        for thread in self._threads:
            thread.join(timeout_s)

    def _supervise(self, index: int) -> None:
        restarts = Backoff(FIRST_RESTART_DELAY_S, MAX_RESTART_DELAY_S, stop=self._stopping)
        config = json.dumps(
            asdict(self.config) | {"instance": f"{self.config.instance}/{index + 1}"}
        )
        while True:
            with self._lock:
                if self._stopping.is_set():
                    return
                # A session of its own: a terminal's Ctrl-C reaches the service, which
                # then stops its workers through their stdin, not the workers directly.
                proc = subprocess.Popen(
                    self.command,
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    text=True,
                    start_new_session=True,
                )
                self._procs[index] = proc
                self.started += 1
                assert proc.stdin is not None and proc.stdout is not None
                with contextlib.suppress(OSError, ValueError):  # it died at once: seen below
                    proc.stdin.write(config + "\n")
                    proc.stdin.flush()
            began = time.monotonic()
            for line in proc.stdout:
                self._report(line)
            code = proc.wait()
            _close(proc.stdout)  # its end of file came: one pipe fewer per restart
            _close(proc.stdin)
            if self._stopping.is_set():
                return
            if time.monotonic() - began >= STEADY_S:
                restarts.reset()
            log.warning(
                "intake worker %d exited (code %s); starting another within %.0f s",
                proc.pid,
                code,
                restarts.upcoming_s,
            )
            if not restarts.wait():
                return

    def _report(self, line: str) -> None:
        try:
            report = json.loads(line)
        except ValueError:
            log.warning("intake worker wrote a line that is not a report: %r", line[:200])
            return
        try:
            self.on_report(report)
        except Exception:
            log.exception("could not apply an intake worker's report %r", line[:200])


def _close(stream: IO[str] | None) -> None:
    if stream is None:
        return
    with contextlib.suppress(OSError):  # the worker is gone already
        stream.close()
