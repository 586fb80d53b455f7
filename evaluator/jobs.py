"""The evaluator's scheduled jobs: deadline sweeps, gauge refreshes and retention passes.

Deadline sweeps decide due CMs (timeouts) with their own sessions, in a thread that runs
each one when the earliest pending CM is due (:mod:`evaluator.sweep_timer`). APScheduler
interval jobs refresh the store and ack-queue gauges (:mod:`evaluator.gauges`) and, with
a retention policy, archive and delete old decided CMs (:mod:`evaluator.retention`). A
job that fails is counted and retried at its next run; a sweep failing the same way
every second is logged once, not once per run.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable
from datetime import datetime, timedelta

from apscheduler.jobstores.base import JobLookupError
from apscheduler.schedulers.background import BackgroundScheduler
from sqlalchemy.orm import Session

from condmsg.core.errors import ConfigError
from condmsg.core.timeutil import utcnow
from condmsg.infra.repeated_failures import RepeatedFailures
from condmsg.spheres.store import SPHERES
from evaluator import decisions
from evaluator.actions import Actions
from evaluator.config import EvaluatorConfig
from evaluator.failures import is_transient
from evaluator.gauges import ServiceGauges
from evaluator.intake import describe
from evaluator.metrics import EvaluatorMetrics
from evaluator.retention import Archived, retain
from evaluator.spheres import settle_spheres
from evaluator.store_setup import SenderStore
from evaluator.summary import DecisionSummary
from evaluator.sweep_timer import SweepTimer

log = logging.getLogger(__name__)

#: The first retention pass runs this long after start (or one interval, if shorter): a
#: long interval must not be starved by restarts, and start-up is not slowed down.
RETENTION_FIRST_RUN_S = 60.0
#: How long a due CM that a sweep cannot judge waits before it is tried again.
PARK_S = 60.0


class ScheduledJobs:
    """Deadline sweeps (unless ``config.sweeps`` is off) and retention passes (with
    ``config.retention``), run in a background scheduler between :meth:`start` and
    :meth:`stop`, or at once with :meth:`sweep` and :meth:`retain`.

    ``on_decided`` is called after a sweep decided CMs (to wake the outbox relay);
    ``should_stop`` ends a retention pass between its batches. With ``gauges``, they are
    refreshed every ``config.gauge_interval_s``, the first time at start, and the summary
    line is logged every ``config.summary_interval_s`` (:mod:`evaluator.summary`).
    """

    def __init__(
        self,
        config: EvaluatorConfig,
        store: SenderStore,
        *,
        instance: str,
        metrics: EvaluatorMetrics,
        clock: Callable[[], datetime],
        stop: threading.Event,
        on_decided: Callable[[], None],
        gauges: ServiceGauges | None = None,
    ) -> None:
        self._config = config
        self._store = store
        self._instance = instance
        self._metrics = metrics
        self._clock = clock
        self._stop = stop
        self._on_decided = on_decided
        self._gauges = gauges
        self._sweep_failures = RepeatedFailures(
            log, "deadline sweep", on_failure=metrics.sweep_failures.inc
        )
        self._scheduler = BackgroundScheduler(timezone="UTC")
        # The earliest next check the last sweep of the timer saw (None: none, or unknown).
        self._due: datetime | None = None
        self._timer = (
            SweepTimer(
                self._sweep_job,
                interval_s=config.sweep_interval_s,
                clock=clock,
                name=f"evaluator-sweep-{config.sender}",
            )
            if config.sweeps
            else None
        )

    def start(self) -> None:
        """Schedule retention and the gauges (from now) and start the scheduler, if there
        is any job."""
        self._schedule_retention()
        if self._gauges is not None:
            self._scheduler.add_job(
                self._gauges.refresh,  # it logs and counts its own failures
                "interval",
                seconds=self._config.gauge_interval_s,
                id="gauges",
                next_run_time=utcnow(),
                max_instances=1,  # its broker connection is used by one thread at a time
                coalesce=True,
            )
        if self._gauges is not None and self._config.summary_interval_s > 0:
            summary = DecisionSummary(self._metrics, self._gauges)
            self._scheduler.add_job(
                summary.log,
                "interval",
                seconds=self._config.summary_interval_s,
                id="summary",
                max_instances=1,
                coalesce=True,
            )
        if self._scheduler.get_jobs():  # an intake worker has none
            self._scheduler.start()
        if self._timer is not None:
            self._timer.start()

    def refresh_gauges_now(self) -> None:
        """Run the gauges' refresh at once rather than at its next interval (the ack queue
        was just declared, so what ``/readyz`` knows of the broker is out of date)."""
        if self._gauges is not None and self._scheduler.running:
            with contextlib.suppress(JobLookupError):
                self._scheduler.modify_job("gauges", next_run_time=utcnow())

    def stop(self) -> None:
        """Wait for a running job to finish, then stop the scheduler."""
        if self._timer is not None:
            self._timer.stop()
        if self._scheduler.running:
            self._scheduler.shutdown(wait=True)
        if self._gauges is not None:
            self._gauges.close()

    @property
    def running(self) -> bool:
        """Whether the scheduler and the sweeps run (started, not stopped)."""
        sweeping = self._timer is None or self._timer.running
        return bool(self._scheduler.running) and sweeping

    # -- deadline sweeps ------------------------------------------------------------------

    def _sweep_job(self) -> datetime | None:
        """One sweep of CMs and spheres; the earliest next check of a pending CM (None
        when the sweep failed: the next one comes after the interval)."""
        # Woken because a CM is due: claim it at once, without first asking whether any is.
        expected = self._due is not None and self._due <= self._clock()
        try:
            _, self._due = self._sweep_cms(look_first=not expected)
            self.sweep_spheres()
        except Exception as exc:
            self._due = None
            self._sweep_failures.failed(exc)
            return None
        self._sweep_failures.succeeded()
        return self._due

    def sweep(self) -> int:
        """Decide or reschedule every CM whose next check is due; returns decisions made."""
        return self._sweep_cms()[0]

    def _sweep_cms(self, *, look_first: bool = True) -> tuple[int, datetime | None]:
        """:meth:`sweep`; also returns the earliest next check left among the pending CMs
        (later than the last claim: a due CM another instance holds is not waited for)."""
        self._store.prepare()
        store = self._store.decisions
        if look_first:
            # Nothing due, the common case, costs what a claim that finds nothing costs:
            # one read of the index's first entry, which also tells when to come back.
            with Session(self._store.engine) as session, session.begin():
                due = store.next_check(session)
            if due is None or due > self._clock():
                return 0, due
        batch = self._config.sweep_batch
        decided = 0
        while True:
            with Session(self._store.engine) as session, session.begin():
                claimed_at = self._clock()
                ids = store.claim_due(session, claimed_at, batch)
                if ids:
                    # The decision instant once the rows are claimed (locked): an intake
                    # batch that committed acks for them meanwhile stamped them earlier.
                    now = self._clock()
                    try:
                        with session.begin_nested():
                            done = self._judge_due(session, ids, now)
                    except Exception as exc:
                        if is_transient(exc):
                            raise
                        done = self._judge_due_apart(session, ids, now, exc)
                if len(ids) < batch:
                    due = store.next_check(session, after=claimed_at)
            if ids:
                # A member decided here may decide its sphere in the same transaction.
                self._metrics.observe_decisions(done.outcomes, done.spheres)
                decided += len(done.outcomes)
            if len(ids) < batch:
                break
        if decided:
            self._on_decided()
        return decided, due

    def sweep_spheres(self) -> int:
        """Decide or reschedule every Dependency-Sphere whose next check is due (a commit
        or abort to act on, a deadline passed); returns the spheres decided."""
        self._store.prepare()
        batch = self._config.sweep_batch
        decided = 0
        while True:
            with Session(self._store.engine) as session, session.begin():
                ids = SPHERES.claim_due(session, self._clock(), batch)
                if not ids:
                    break
                now = self._clock()
                actions = Actions(session, self._store.decisions, now, secret=self._store.secret)
                settle_spheres(
                    session,
                    list(SPHERES.lock(session, ids).values()),
                    spheres=SPHERES,
                    actions=actions,
                    now=now,
                    ack_grace=self._config.ack_grace,
                    instance=self._instance,
                )
                outcomes = actions.flush()
            self._metrics.observe_spheres(outcomes)
            decided += len(outcomes)
            if len(ids) < batch:
                break
        if decided:
            self._on_decided()
        return decided

    def _judge_due(self, session: Session, ids: list[str], now: datetime) -> decisions.Decided:
        store = self._store.decisions
        return decisions.judge(
            session,
            store.load_cms(session, ids),
            store=store,
            now=now,
            ack_grace=self._config.ack_grace,
            instance=self._instance,
            secret=self._store.secret,
        )

    def _judge_due_apart(
        self, session: Session, ids: list[str], now: datetime, failure: Exception
    ) -> decisions.Decided:
        """Judge claimed CMs one at a time (each in a SAVEPOINT) after their batch failed:
        a CM that cannot be judged (a stored condition that no longer decodes, a bug) is
        parked for :data:`PARK_S` and logged, so that it never holds back the CMs due with
        it."""
        log.warning("sweep of %d due CMs failed (%s); judging them one by one", len(ids), failure)
        done = decisions.Decided()
        for cm_id in ids:
            try:
                with session.begin_nested():
                    alone = self._judge_due(session, [cm_id], now)
                done.outcomes += alone.outcomes
                done.spheres += alone.spheres
            except Exception as exc:
                if is_transient(exc):
                    raise
                log.error(
                    "CM %s cannot be judged (%s); looked at again in %.0f s",
                    cm_id,
                    describe(exc),
                    PARK_S,
                )
                parked = [(cm_id, now + timedelta(seconds=PARK_S))]
                self._store.decisions.set_next_checks(session, parked)
                self._metrics.parked.inc()
        return done

    # -- retention ------------------------------------------------------------------------

    def _schedule_retention(self) -> None:
        if self._config.retention is None:
            return
        interval_s = self._config.retention_interval_s
        self._scheduler.add_job(
            self._retention_job,
            "interval",
            seconds=interval_s,
            id="retention",
            # Added when the scheduler starts, so that this instant is not already past.
            next_run_time=utcnow() + timedelta(seconds=min(interval_s, RETENTION_FIRST_RUN_S)),
            max_instances=1,  # a long pass is never run twice at once in one process
            coalesce=True,
        )

    def _retention_job(self) -> None:
        try:
            self.retain()
        except Exception:
            self._metrics.retention_failures.inc()
            log.exception(
                "retention pass failed (its failed batch is rolled back); the next run retries"
            )

    def retain(self) -> int:
        """One retention pass now (archive, then delete, CMs decided before ``now -
        retention``); returns the rows archived and deleted. Stops between batches when
        the service stops."""
        policy = self._config.retention_policy
        if policy is None:
            raise ConfigError("retention is not configured (--retention, CONDMSG_RETENTION)")
        archived = retain(
            self._store.engine,
            policy,
            clock=self._clock,
            instance=self._instance,
            should_stop=self._stop.is_set,
            on_archived=self._archived,
        )
        return sum(a.total for a in archived)

    def _archived(self, archived: Archived) -> None:
        self._metrics.observe_archived(archived)
        log.info(
            "retention: archived and deleted %d rows in %s", archived.total, archived.directory
        )
