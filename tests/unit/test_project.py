"""The project's own files: compose.yaml, the CLI, the demo."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml

from condmsg.cli import main
from condmsg.demo.timelines import run, scenarios

ROOT = Path(__file__).resolve().parents[2]


def test_compose_has_both_services_with_healthchecks() -> None:
    compose = yaml.safe_load((ROOT / "compose.yaml").read_text())
    services = compose["services"]
    assert "management" in services["rabbitmq"]["image"]
    assert services["postgres"]["image"].startswith("postgres:")
    for name in ("rabbitmq", "postgres"):
        assert services[name]["healthcheck"]["test"], name
    assert "5672:5672" in services["rabbitmq"]["ports"]
    assert "5432:5432" in services["postgres"]["ports"]


def test_cli_version(capsys) -> None:  # type: ignore[no-untyped-def]
    assert main(["version"]) == 0
    assert capsys.readouterr().out.startswith("condmsg 0.")


def test_cli_help_runs_as_console_script() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "condmsg.cli", "--help"], capture_output=True, text=True, check=True
    )
    assert "version" in out.stdout


def test_demo_timelines_reach_the_expected_verdicts() -> None:
    finals = [list(run(s))[-1][1].verdict.value for s in scenarios()]
    assert finals == ["satisfied", "violated", "satisfied", "violated"]


def test_demo_declares_example1_failure_at_qr3s_processing_deadline() -> None:
    failure = scenarios()[1]
    steps = list(run(failure))
    _, last = steps[-1]
    _, before = steps[-2]
    assert before.verdict.value == "pending"
    assert before.next_check_at is not None
    assert last.verdict.value == "violated"
    assert any("'qr3'" in r and "process" in r for r in last.reasons)
