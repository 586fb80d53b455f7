"""The mutation check of the harness: ``condmsg conformance`` rejects every defective
variant of the repository's own receivers (``--defect NAME``, each listed by the
receiver's ``--list-defects``), while the honest ones pass every scenario
(test_harness.py). A defect the harness lets through fails here: the harness has a blind
spot, and the scenario that should see it is missing.

The variants run with ``--fail-fast`` (a run ends at the first failed scenario) and fewer
kills in ``kill-anywhere`` than the honest runs: a receiver that commits its acks apart
from its app's writes is caught well within them.
"""

from __future__ import annotations

import shlex
import subprocess
from collections.abc import Callable

import pytest

from condmsg.conformance import ConformanceConfig, run

from .conftest import PYTHON_RECEIVER, explain, node_receiver

pytestmark = [pytest.mark.rabbitmq, pytest.mark.postgres]

#: Kills for a defective variant: enough that a kill between ack-second-transaction's two
#: transactions is all but certain, and few enough to keep the suite short.
DEFECT_KILLS = 30
#: Deadlines as written: a defect caught by a timeout costs that timeout.
DEFECT_SCALE = 1.0
#: The notes of a run that never judged the receiver: a defect must be caught by a
#: scenario, not by a receiver that cannot start.
NOT_JUDGED = ("before it was ready", "harness error")


#: The defects both receivers offer under these names (docs/conformance.md).
SHARED = frozenset(
    {
        "refuse-wrong-recipient",
        "ignore-fail-once",
        "ack-duplicates",
        "ack-per-part",
        "ack-second-transaction",
        "no-header-validation",
        "no-retry-pause",
        "no-original-queue-header",
        "wrong-sequence-id",
        "read-mode",
        "no-verify",
        "no-cancel-out",
        "deliver-duplicates",
        "no-invalid-queue",
        "never-give-up",
        "no-sequence-timeout",
        "ack-before-commit",
        "wrong-ack-recipient",
        "no-compensation",
        "drop-trace-context",
    }
)
RECEIVERS: dict[str, Callable[[], str]] = {
    "python": lambda: PYTHON_RECEIVER,
    "node": node_receiver,
}


def _defects(command: Callable[[], str]) -> list[str]:
    """The receiver's ``--list-defects``: one name a line, exit 0."""
    try:
        listed = subprocess.run(
            [*shlex.split(command()), "--list-defects"],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
    except (subprocess.CalledProcessError, pytest.fail.Exception) as exc:
        return [f"unlisted: {exc}"]
    return listed.stdout.split()


def _cases() -> list[object]:
    return [
        pytest.param(command, defect, id=f"{name}-{defect}")
        for name, command in RECEIVERS.items()
        for defect in _defects(command)
    ]


@pytest.mark.parametrize("name", RECEIVERS)
def test_each_receiver_offers_the_shared_defects(name: str) -> None:
    missing = SHARED - set(_defects(RECEIVERS[name]))
    assert not missing, f"{name} lacks the defects {sorted(missing)}"


def test_a_defect_the_python_receiver_does_not_know_is_a_usage_error() -> None:
    done = subprocess.run(
        [*shlex.split(PYTHON_RECEIVER), "--defect", "no-such-defect"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "invalid choice: 'no-such-defect'" in done.stderr


@pytest.mark.parametrize(("command", "defect"), _cases())
def test_the_harness_rejects_a_receiver_with_a_defect(
    command: Callable[[], str],
    defect: str,
    conformance_config: Callable[..., ConformanceConfig],
) -> None:
    assert not defect.startswith("unlisted:"), defect
    config = conformance_config(
        f"{command()} --defect {defect}",
        fail_fast=True,
        kills=DEFECT_KILLS,
        scale=DEFECT_SCALE,
    )
    report = run(config)
    assert not report.passed, f"the harness let {defect} through\n{explain(report, config)}"
    notes = [r.note for r in report.failures]
    assert not any(n for n in notes if any(s in n for s in NOT_JUDGED)), explain(report, config)
