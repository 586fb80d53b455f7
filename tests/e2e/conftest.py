"""Fixtures for the end-to-end tests: the evaluator and the receivers as separate
processes (``python -m evaluator``, ``python -m tests.e2e.rx``), stopped with SIGTERM."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pika
import pytest

from tests.waiting import wait_for

SECRET = b"e2e-test-secret-7f3a9c1e5b2d8064"
ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Procs:
    """The processes a test started; each is stopped with SIGTERM and must exit 0."""

    amqp_url: str
    pg_url: str
    sender: str
    unique_name: str
    tmp_path: Path
    started: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def _spawn(
        self, args: list[str], env: dict[str, str], log_name: str
    ) -> subprocess.Popen[bytes]:
        log = (self.tmp_path / log_name).open("ab")
        proc = subprocess.Popen(
            [sys.executable, *args], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT
        )
        self.started.append(proc)
        return proc

    def _env(self) -> dict[str, str]:
        return {
            **os.environ,
            "CONDMSG_DB_URL": self.pg_url,
            "CONDMSG_AMQP_URL": self.amqp_url,
            "CONDMSG_SECRET": SECRET.decode(),
        }

    def evaluator(self, *extra: str) -> subprocess.Popen[bytes]:
        args = ["-m", "evaluator", "--sender", self.sender, "--sweep-interval", "0.1"]
        args += ["--create-schema"]  # a test may start it before its sender made the store
        args += ["--ack-grace-ms", "100", *extra]
        return self._spawn(args, self._env(), f"evaluator-{len(self.started)}.log")

    def relay(self) -> subprocess.Popen[bytes]:
        """``condmsg relay`` over the sender's store (for evaluators run with --no-relay)."""
        code = "import sys; from condmsg.cli import main; sys.exit(main(['relay']))"
        return self._spawn(["-c", code], self._env(), f"relay-{len(self.started)}.log")

    def receiver(self, queue: str, recipient: str, mode: str, go_file: Path | None = None) -> Path:
        """Start a receiver process on ``queue``; returns the file it records messages in."""
        n = len(self.started)
        out = self.tmp_path / f"rx-{n}.jsonl"
        config = {
            "amqp_url": self.amqp_url,
            "db_url": f"sqlite:///{self.tmp_path / f'rx-{n}.db'}",
            "recipient": recipient,
            "queue": queue,
            "mode": mode,
            "out": str(out),
            "go_file": str(go_file) if go_file else None,
            "invalid_queue": f"{self.unique_name}.invalid",
        }
        self._spawn(["-m", "tests.e2e.rx", json.dumps(config)], dict(os.environ), f"rx-{n}.log")
        return out

    def wait_ready(self, outs: list[Path], consumers: int, timeout: float = 60.0) -> None:
        """Wait until every receiver is up and ``consumers`` evaluators consume acks."""
        wait_for(lambda: all(o.exists() and o.read_text() for o in outs), timeout)
        wait_for(lambda: ack_consumers(self.amqp_url, self.sender) >= consumers, timeout)

    def stop(self, proc: subprocess.Popen[bytes], timeout: float = 30.0) -> int:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            return proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            return -9

    def stop_all(self) -> dict[int, int]:
        """SIGTERM to everything still running; the exit codes by pid."""
        return {p.pid: self.stop(p) for p in self.started}


def ack_consumers(amqp_url: str, sender: str) -> int:
    connection = pika.BlockingConnection(pika.URLParameters(amqp_url))
    try:
        channel = connection.channel()
        try:
            ok = channel.queue_declare(f"condmsg.{sender}.ack", passive=True)
        except pika.exceptions.ChannelClosedByBroker:
            return 0
        return int(ok.method.consumer_count)
    finally:
        if connection.is_open:
            connection.close()


def publish_acks(amqp_url: str, sender: str, pairs: list[tuple[str, str]]) -> None:
    """Genuine READ acks straight to the ack queue (as receiver relays would), one for each
    ``(cm_id, destination)``."""
    from condmsg.core import protocol
    from condmsg.core.acks import AckKind
    from condmsg.core.timeutil import utcnow

    connection = pika.BlockingConnection(pika.URLParameters(amqp_url))
    try:
        channel = connection.channel()
        channel.confirm_delivery()
        for cm_id, destination in pairs:
            ack = protocol.AckMessage(
                ack_id=uuid.uuid4().hex,
                cm_id=cm_id,
                destination=destination,
                kind=AckKind.READ,
                read_at=utcnow(),
                committed_at=None,
                recipient=None,
                receiver="e2e",
                token=protocol.copy_token(SECRET, cm_id, destination, None),
            )
            channel.basic_publish(
                "", protocol.ack_queue(sender), ack.to_json(), pika.BasicProperties(delivery_mode=2)
            )
    finally:
        connection.close()


def records(out: Path) -> list[dict[str, Any]]:
    """What a receiver process recorded (messages, then stats after it stopped)."""
    if not out.exists():
        return []
    lines = [json.loads(line) for line in out.read_text().splitlines() if line.strip()]
    return [line for line in lines if "ready" not in line]


@pytest.fixture
def procs(amqp_url: str, pg_url: str, unique_name: str, tmp_path: Path) -> Iterator[Procs]:
    procs = Procs(amqp_url, pg_url, unique_name.replace(".", "-"), unique_name, tmp_path)
    try:
        yield procs
    finally:
        procs.stop_all()


@pytest.fixture
def test_secret() -> bytes:
    """The processes of these tests get it as CONDMSG_SECRET."""
    return SECRET
