"""The intake workers' supervisor with stand-in worker programs, as real processes (no
broker, no database): reports reach the service, a worker that exits is started again,
stopping ends the workers, and the real worker refuses a bad configuration line."""

from __future__ import annotations

import logging
import subprocess
import sys
from typing import Any

import pytest

from evaluator import workers
from evaluator.workers import IntakeWorkers
from tests.unit.test_intake_workers import CONFIG
from tests.waiting import wait_for


def _program(body: str) -> tuple[str, ...]:
    return (sys.executable, "-c", body)


def test_reports_reach_the_service_and_an_exited_worker_is_started_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(workers, "FIRST_RESTART_DELAY_S", 0.05)
    # Reads its configuration, reports one batch, writes a stray line, exits.
    program = _program(
        "import json, sys; c = json.loads(sys.stdin.readline()); "
        "print(json.dumps({'acks': 2, 'instance': c['instance']})); print('not json'); "
        "sys.stdout.flush()"
    )
    reports: list[dict[str, Any]] = []
    pool = IntakeWorkers(1, CONFIG, reports.append, command=program)
    pool.start()
    try:
        wait_for(lambda: len(reports) >= 2, timeout=20)
    finally:
        pool.stop()
    assert pool.started >= 2
    assert {r["instance"] for r in reports} == {"host:1/1"}
    assert all(r["acks"] == 2 for r in reports)


def test_stop_closes_the_leash_and_kills_what_does_not_listen(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The first workers exit when their stdin closes, well inside a long stop timeout
    (none is killed); the second never read it again and are killed once a short one has
    passed. What stop did is counted in its log lines, not timed."""
    obedient = _program("import sys; sys.stdin.readline(); sys.stdin.read()")
    deaf = _program("import sys, time; sys.stdin.readline(); time.sleep(60)")
    for program, timeout_s, killed in ((obedient, 60.0, 0), (deaf, 1.0, 2)):
        pool = IntakeWorkers(2, CONFIG, lambda _r: None, command=program)
        pool.start()
        wait_for(lambda pool=pool: len(pool.pids()) == 2, timeout=20)  # type: ignore[misc]
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger=workers.__name__):
            pool.stop(timeout_s=timeout_s)
        kills = [r for r in caplog.records if "did not stop in time; killed" in r.getMessage()]
        assert len(kills) == killed, [r.getMessage() for r in caplog.records]
        assert pool.pids() == []
        assert pool.started == 2  # nothing started again while stopping


def test_a_worker_with_a_bad_configuration_line_exits_at_once() -> None:
    done = subprocess.run(
        workers.WORKER_COMMAND, input="not json\n", capture_output=True, text=True, timeout=60
    )
    assert done.returncode != 0
    assert "JSONDecodeError" in done.stderr
    # No line at all: the service went away before configuring it; a clean exit.
    done = subprocess.run(
        workers.WORKER_COMMAND, input="", capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0
