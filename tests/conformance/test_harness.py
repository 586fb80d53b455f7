"""``condmsg conformance`` against the reference receivers (they pass) and against
receivers broken on purpose (the harness catches them)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable

import pytest

from condmsg.conformance import SCENARIOS, ConformanceConfig, run

from .conftest import PYTHON_RECEIVER, ROOT, explain, node_receiver

pytestmark = [pytest.mark.rabbitmq, pytest.mark.postgres]

#: A failing scenario waits out its deadlines: shorter ones for the receivers that fail.
FAILING_SCALE = 0.5


def test_python_receiver_passes_every_scenario(
    conformance_config: Callable[..., ConformanceConfig],
) -> None:
    config = conformance_config(PYTHON_RECEIVER)
    report = run(config)
    assert [r.name for r in report.results] == list(SCENARIOS)
    assert report.passed, explain(report, config)


def test_node_receiver_passes_every_scenario(
    conformance_config: Callable[..., ConformanceConfig],
) -> None:
    config = conformance_config(node_receiver())
    report = run(config)
    assert [r.name for r in report.results] == list(SCENARIOS)
    assert report.passed, explain(report, config)


def test_a_receiver_that_acks_before_its_commit_fails(
    conformance_config: Callable[..., ConformanceConfig],
) -> None:
    """Non-transactional reads ack the broker before the app's write commits: a crash in
    the app loses the message, and the READ ack cannot satisfy process_within."""
    only = ("original", "crash-before-commit")
    config = conformance_config(f"{PYTHON_RECEIVER} --read-mode", only=only, scale=FAILING_SCALE)
    report = run(config)
    assert {r.name: r.passed for r in report.results} == dict.fromkeys(only, False), explain(
        report, config
    )


def test_a_receiver_that_ignores_tokens_fails(
    conformance_config: Callable[..., ConformanceConfig],
) -> None:
    """Without a secret a receiver hands over forged copies, compensations and notices
    (an unsigned copy is still refused: its token header is required all the same)."""
    only = ("forged-copy", "forged-compensation", "unsigned-compensation", "kind-swapped-token")
    config = conformance_config(
        f"{PYTHON_RECEIVER} --no-verify", only=(*only, "original"), scale=FAILING_SCALE
    )
    report = run(config)
    verdicts = {r.name: r.passed for r in report.results}
    assert verdicts == {**dict.fromkeys(only, False), "original": True}, explain(report, config)


def test_the_command_prints_a_table_and_a_json_line_and_exits_1_on_a_failure(
    conformance_config: Callable[..., ConformanceConfig],
) -> None:
    config = conformance_config(f"{PYTHON_RECEIVER} --no-verify", scale=FAILING_SCALE)
    args = ["--queue", config.queue, "--recipient", config.recipient]
    args += ["--receiver-cmd", config.receiver_cmd, "--db-url", config.store_url]
    args += ["--amqp-url", config.amqp_url, "--invalid-queue", config.invalid]
    args += ["--only", "plain-message", "--only", "forged-copy", "--scale", str(config.scale)]
    done = subprocess.run(
        [sys.executable, "-m", "condmsg.cli", "conformance", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    lines = done.stdout.strip().splitlines()
    result = json.loads(lines[-1])
    assert result["conformance"] == "fail"
    assert result["scenarios"]["plain-message"]["passed"] is True
    assert result["scenarios"]["forged-copy"]["passed"] is False
    assert any(line.startswith("forged-copy") and "FAIL" in line for line in lines)
