"""A conditional message driven with the ``condmsg`` command alone, as an operator without
any Python of their own would: the schema, the relay, the evaluator, a send that waits for
its outcome under a YAML condition, a transactional receiver, the outcomes and the status,
each a process of its own; the services stopped with SIGTERM exit 0."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.e2e.conftest import ROOT, ack_consumers
from tests.integration.cli.test_cli_commands import queue_exists
from tests.waiting import wait_for

pytestmark = [pytest.mark.rabbitmq, pytest.mark.postgres, pytest.mark.slow]

CLI = (sys.executable, "-m", "condmsg.cli")

Spawn = Callable[..., "subprocess.Popen[bytes]"]


@pytest.fixture
def env(pg_url: str, amqp_url: str) -> dict[str, str]:
    """The sender side's settings, from the environment only."""
    return {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "CONDMSG_DB_URL": pg_url,
        "CONDMSG_AMQP_URL": amqp_url,
        "CONDMSG_SECRET": "cli-only-secret-4d8b2f6a0c9e7153",
    }


@pytest.fixture
def background(env: dict[str, str], tmp_path: Path) -> Iterator[Spawn]:
    """``background(name, *args)`` starts ``condmsg *args`` logging to ``name.log``; all
    are stopped with SIGTERM at the end and must exit 0."""
    started: list[tuple[str, subprocess.Popen[bytes]]] = []

    def spawn(name: str, *args: str) -> subprocess.Popen[bytes]:
        log = (tmp_path / f"{name}.log").open("ab")
        proc = subprocess.Popen([*CLI, *args], cwd=ROOT, env=env, stdout=log, stderr=log)
        started.append((name, proc))
        return proc

    yield spawn
    codes = {}
    for name, proc in started:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            codes[name] = proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            codes[name] = proc.wait()
    logs = {name: (tmp_path / f"{name}.log").read_text()[-2000:] for name, _ in started}
    assert all(code == 0 for code in codes.values()), (codes, logs)


def run(env: dict[str, str], *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout
    )


def test_a_cm_from_send_to_status_with_the_command_line_only(
    env: dict[str, str],
    background: Spawn,
    amqp_url: str,
    unique_name: str,
    tmp_path: Path,
) -> None:
    sender = unique_name.replace(".", "-")
    queue = f"{unique_name}.qcentral"
    upgraded = run(env, "db", "upgrade", "--store", "sender")
    assert upgraded.returncode == 0, upgraded.stderr
    assert "sender:" in upgraded.stdout and "(current)" in upgraded.stdout

    background("relay", "relay")
    background(
        "evaluator",
        "evaluator",
        "--sender",
        sender,
        "--no-relay",  # `condmsg relay` publishes the store
        "--sweep-interval",
        "0.1",
        "--ack-grace-ms",
        "100",
    )
    wait_for(lambda: ack_consumers(amqp_url, sender) >= 1, timeout=60)

    condition = tmp_path / "flight.yaml"
    condition.write_text(
        "# the paper's Example 2: some controller picks the flight up within 20 s\n"
        f"type: destination\nname: {queue}\npickup_within_ms: 20000\n"
        "evaluation_timeout_ms: 21000\n"
    )
    payload = tmp_path / "flight.txt"
    payload.write_bytes(b"flight LH400 inbound")
    send = ("send", "--sender", sender, "--condition", str(condition), "--payload", str(payload))
    sending = subprocess.Popen(
        [*CLI, *send, "--wait", "60"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        # The sender declares the destination queue when it sends.
        wait_for(lambda: queue_exists(amqp_url, queue), timeout=60)
        handled = tmp_path / "handled.txt"
        consumed = run(
            env,
            "consume",
            queue,
            "--create-schema",  # the receiver's own SQLite store, made on first use
            "--recipient",
            "controller-7",
            "--transactional",
            "--count",
            "1",
            "--timeout",
            "30",
            "--exec",
            f"cat > {handled}",
            "--invalid-queue",
            f"{unique_name}.invalid",
            "--db-url",
            f"sqlite:///{tmp_path / 'controller-7.db'}",
        )
        assert consumed.returncode == 0, consumed.stderr
        assert handled.read_bytes() == b"flight LH400 inbound"
        out, err = sending.communicate(timeout=90)
    finally:
        if sending.poll() is None:
            sending.kill()
            sending.wait()
    assert sending.returncode == 0, err
    cm_id, outcome_line = out.splitlines()
    outcome = json.loads(outcome_line)
    assert (outcome["cm_id"], outcome["verdict"]) == (cm_id, "satisfied")
    assert outcome["facts"][0]["recipients"] == ["controller-7"]

    listed = run(env, "outcomes", "--sender", sender)
    assert listed.returncode == 0, listed.stderr
    assert [json.loads(line)["cm_id"] for line in listed.stdout.splitlines()] == [cm_id]

    status = run(env, "status", cm_id)
    assert status.returncode == 0, status.stderr
    assert f"cm {cm_id} from {sender}" in status.stdout
    assert "commit ack by controller-7" in status.stdout
    assert "verdict: satisfied" in status.stdout
