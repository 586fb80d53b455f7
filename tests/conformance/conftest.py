"""Fixtures for the conformance tests: a harness configuration on a fresh PostgreSQL
schema and queue names of the test's own, and the commands of the receivers under test."""

from __future__ import annotations

import shlex
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from condmsg.conformance import ConformanceConfig, Report

ROOT = Path(__file__).resolve().parents[2]
NODE_DIR = ROOT / "interop" / "node"
PYTHON_RECEIVER = f"{shlex.quote(sys.executable)} -m condmsg.conformance.python_receiver"
#: Deadlines scaled for a shared two-core machine running other tests beside these.
SCALE = 2.0
#: The kill-anywhere scenario's kills for the Python receiver: each kill costs a restart,
#: and the Python receiver starts slower than the Node one (which gets the default).
PYTHON_KILLS = 40


def node_receiver() -> str:
    """The Node receiver's command; its packages come from ``make test``
    (``npm ci --prefix interop/node``)."""
    node = shutil.which("node")
    if node is None or not (NODE_DIR / "node_modules" / "amqplib").is_dir():
        pytest.fail("the Node receiver needs node and `npm ci --prefix interop/node` (make test)")
    return f"{shlex.quote(node)} {shlex.quote(str(NODE_DIR / 'receiver.js'))}"


@pytest.fixture
def conformance_config(
    amqp_url: str, pg_url: str, unique_name: str, tmp_path: Path
) -> Callable[..., ConformanceConfig]:
    """``conformance_config(receiver_cmd, **overrides)``: a run against a receiver of
    ``{unique_name}.q`` on a fresh schema, with its output in the test's directory."""

    def make(receiver_cmd: str, **overrides: Any) -> ConformanceConfig:
        options: dict[str, Any] = {
            "amqp_url": amqp_url,
            "store_url": pg_url,
            "receiver_cmd": receiver_cmd,
            "queue": f"{unique_name}.q",
            "invalid_queue": f"{unique_name}.invalid",
            "recipient": "conformance-rx",
            "secret": "conformance-test-secret-ü-7c2e9a4f",
            "scale": SCALE,
            "log_path": str(tmp_path / "receiver.log"),
        }
        return ConformanceConfig(**(options | overrides))

    return make


def explain(report: Report, config: ConformanceConfig) -> str:
    """The table and the receiver's last output lines, for an assertion message."""
    log = Path(config.log_path or "")
    tail = log.read_text(errors="replace").splitlines()[-30:] if log.is_file() else []
    return "\n".join([report.table(), "--- receiver output ---", *tail])
