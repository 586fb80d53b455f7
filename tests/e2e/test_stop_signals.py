"""SIGTERM and SIGINT end every service within a bounded time, whatever it is doing.

A signal handler that takes a lock can deadlock against the frame it interrupted (the main
loop waiting on an event), so these tests signal the processes again and again, at
different moments of their loops: waiting for a broker that refuses them, connected and
idle, and connected with work to do.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import ROOT, SECRET
from tests.waiting import wait_for

pytestmark = [pytest.mark.rabbitmq, pytest.mark.postgres]

#: The longest a service may take to exit after the signal (seconds).
STOP_WITHIN_S = 5.0


def _start(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "condmsg.cli", *args],
            cwd=ROOT,
            env={**os.environ, **env},
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def _stops_in_time(proc: subprocess.Popen[bytes], signum: int) -> int:
    proc.send_signal(signum)
    started = time.monotonic()
    try:
        code = proc.wait(timeout=STOP_WITHIN_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise AssertionError(f"still running {STOP_WITHIN_S} s after signal {signum}") from None
    assert time.monotonic() - started < STOP_WITHIN_S
    return code


def _logged(log: Path, text: str) -> bool:
    return text in log.read_text(errors="replace")


def _wrong_password(amqp_url: str) -> str:
    return amqp_url.replace("guest:guest@", "guest:not-the-password@")


@pytest.mark.parametrize("delay_s", [0.0, 0.3, 0.7, 1.3])
def test_relay_refused_by_the_broker_stops_on_sigterm(
    amqp_url: str, sqlite_url: str, tmp_path: Path, delay_s: float
) -> None:
    log = tmp_path / "relay.log"
    env = {"CONDMSG_AMQP_URL": _wrong_password(amqp_url), "CONDMSG_DB_URL": sqlite_url}
    proc = _start(["relay", "--create-tables"], env, log)
    wait_for(lambda: _logged(log, "relay started"), timeout=30)
    time.sleep(delay_s)  # a different moment of the retry loop each time
    assert proc.poll() is None, log.read_text()
    assert _stops_in_time(proc, signal.SIGTERM) == 0


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_connected_relay_stops_on_a_signal(
    amqp_url: str, pg_url: str, tmp_path: Path, signum: int
) -> None:
    log = tmp_path / "relay.log"
    env = {"CONDMSG_AMQP_URL": amqp_url, "CONDMSG_DB_URL": pg_url}
    proc = _start(["relay", "--create-tables"], env, log)
    wait_for(lambda: _logged(log, "relay started"), timeout=30)
    time.sleep(0.5)
    assert _stops_in_time(proc, signum) == 0
    assert _logged(log, "relay stopped")


def _started_evaluator(
    amqp_url: str, pg_url: str, sender: str, log: Path, *options: str
) -> subprocess.Popen[bytes]:
    """``condmsg evaluator`` for ``sender``, once its banner is logged (it runs)."""
    env = {
        "CONDMSG_AMQP_URL": amqp_url,
        "CONDMSG_DB_URL": pg_url,
        "CONDMSG_SECRET": SECRET.decode(),
    }
    proc = _start(["evaluator", "--sender", sender, "--create-schema", *options], env, log)
    wait_for(lambda: _logged(log, "evaluator for sender") or proc.poll() is not None, 60)
    assert proc.poll() is None, log.read_text()
    return proc


@pytest.mark.parametrize("delay_s", [0.2, 0.9])
def test_evaluator_stops_on_sigterm(
    amqp_url: str, pg_url: str, unique_name: str, tmp_path: Path, delay_s: float
) -> None:
    proc = _started_evaluator(amqp_url, pg_url, unique_name, tmp_path / "evaluator.log")
    time.sleep(delay_s)
    assert _stops_in_time(proc, signal.SIGTERM) == 0


def test_evaluator_refused_by_the_broker_stops_on_sigterm(
    amqp_url: str, pg_url: str, unique_name: str, tmp_path: Path, make_sender: Any
) -> None:
    log = tmp_path / "evaluator.log"
    env = {
        "CONDMSG_AMQP_URL": _wrong_password(amqp_url),
        "CONDMSG_DB_URL": pg_url,
        "CONDMSG_SECRET": SECRET.decode(),
    }
    proc = _start(["evaluator", "--sender", unique_name, "--create-schema"], env, log)
    wait_for(lambda: len(log.read_text(errors="replace")) > 0 or proc.poll() is not None, 60)
    time.sleep(1.0)
    assert proc.poll() is None, log.read_text()
    assert _stops_in_time(proc, signal.SIGTERM) == 0


def _has_schema(store: Path) -> bool:
    import sqlite3

    if not store.exists():
        return False
    with sqlite3.connect(store) as conn:
        found = conn.execute("SELECT 1 FROM sqlite_master WHERE name = 'condmsg_schema_version'")
        return found.fetchone() is not None


def _declare(amqp_url: str, queue: str) -> None:
    from condmsg.runtime.amqp import connect
    from condmsg.runtime.topology import declare_destination

    connection = connect(amqp_url)
    try:
        declare_destination(connection, queue)
    finally:
        connection.close()


@pytest.mark.parametrize("transactional", [False, True])
def test_consume_waiting_for_messages_stops_on_sigterm(
    amqp_url: str, unique_name: str, tmp_path: Path, transactional: bool
) -> None:
    queue = f"{unique_name}.q"
    _declare(amqp_url, queue)
    log = tmp_path / "consume.log"
    args = ["consume", queue, "--recipient", "r", "--create-schema", "--timeout", "120"]
    args += ["--db-url", f"sqlite:///{tmp_path / 'rx.db'}", "--amqp-url", amqp_url]
    proc = _start([*args, *(["--transactional"] if transactional else [])], {}, log)
    store = tmp_path / "rx.db"
    # Reading polls the queue (no consumer to see): its store created means it is reading.
    wait_for(lambda: _has_schema(store) or proc.poll() is not None, 60)
    assert proc.poll() is None, log.read_text()
    assert _stops_in_time(proc, signal.SIGTERM) == 130, log.read_text()


def test_evaluator_with_intake_workers_stops_on_sigterm(
    amqp_url: str, pg_url: str, unique_name: str, tmp_path: Path
) -> None:
    log = tmp_path / "evaluator.log"
    proc = _started_evaluator(amqp_url, pg_url, unique_name, log, "--intake-processes", "2")
    assert _stops_in_time(proc, signal.SIGTERM) == 0, log.read_text()
