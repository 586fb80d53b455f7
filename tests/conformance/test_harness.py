"""``condmsg conformance`` against the reference receivers (they pass) and against
receivers broken on purpose (the harness catches them)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable

import pytest

from condmsg.conformance import SCENARIOS, ConformanceConfig, run

from .conftest import PYTHON_KILLS, PYTHON_RECEIVER, ROOT, explain, node_receiver

pytestmark = [pytest.mark.rabbitmq, pytest.mark.postgres]

#: A failing scenario waits out its deadlines: shorter ones for the receivers that fail.
FAILING_SCALE = 0.5


def test_python_receiver_passes_every_scenario(
    conformance_config: Callable[..., ConformanceConfig],
) -> None:
    config = conformance_config(PYTHON_RECEIVER, kills=PYTHON_KILLS)
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
    config = conformance_config(
        f"{PYTHON_RECEIVER} --defect read-mode", only=only, scale=FAILING_SCALE
    )
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
        f"{PYTHON_RECEIVER} --defect no-verify", only=(*only, "original"), scale=FAILING_SCALE
    )
    report = run(config)
    verdicts = {r.name: r.passed for r in report.results}
    assert verdicts == {**dict.fromkeys(only, False), "original": True}, explain(report, config)


def test_the_command_prints_a_table_and_a_json_line_and_exits_1_on_a_failure(
    conformance_config: Callable[..., ConformanceConfig],
) -> None:
    config = conformance_config(f"{PYTHON_RECEIVER} --defect no-verify", scale=FAILING_SCALE)
    only = ["--only", "plain-message", "--only", "forged-copy"]
    done = _conformance_cli(config, *only, "--scale", str(config.scale))
    assert done.returncode == 1, done.stdout + done.stderr
    lines = done.stdout.strip().splitlines()
    result = json.loads(lines[-1])
    assert result["conformance"] == "fail"
    assert result["scenarios"]["plain-message"]["passed"] is True
    assert result["scenarios"]["forged-copy"]["passed"] is False
    assert any(line.startswith("forged-copy") and "FAIL" in line for line in lines)


def _conformance_cli(config: ConformanceConfig, *extra: str) -> subprocess.CompletedProcess[str]:
    args = ["--queue", config.queue, "--recipient", config.recipient]
    args += ["--receiver-cmd", config.receiver_cmd, "--db-url", config.store_url]
    args += ["--amqp-url", config.amqp_url, "--invalid-queue", config.invalid, *extra]
    return subprocess.run(
        [sys.executable, "-m", "condmsg.cli", "conformance", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_an_unknown_scenario_is_one_line_naming_the_known_ones_and_exit_2(
    conformance_config: Callable[..., ConformanceConfig],
) -> None:
    config = conformance_config(PYTHON_RECEIVER)
    done = _conformance_cli(config, "--only", "plain-message", "--only", "nosuchscenario")
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stdout == ""
    [line] = done.stderr.splitlines()
    assert "unknown scenarios nosuchscenario" in line
    assert all(name in line for name in SCENARIOS)


def test_a_receiver_command_that_exits_at_once_is_reported_at_once(
    conformance_config: Callable[..., ConformanceConfig],
) -> None:
    """A command the shell cannot find ends with 127: reported as soon as it ends, not
    after the 60 s the harness gives a receiver to come up."""
    config = conformance_config("/nonexistent/receiver --serve")
    started = time.monotonic()
    done = _conformance_cli(config, "--only", "plain-message", "--scale", "1")
    assert time.monotonic() - started < 30, "the harness waited for a receiver that had ended"
    assert done.returncode == 1, done.stdout + done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    note = result["scenarios"]["plain-message"]["note"]
    assert note == "the receiver process ended with status 127 before it was ready"
    assert "Traceback" not in done.stderr


def test_a_bad_kill_count_is_a_usage_error(
    conformance_config: Callable[..., ConformanceConfig],
) -> None:
    done = _conformance_cli(conformance_config(PYTHON_RECEIVER), "--kills", "0")
    assert done.returncode == 2
    assert "expected a whole number of kills >= 1, got '0'" in done.stderr
