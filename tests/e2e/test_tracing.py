"""Tracing end to end: Example 1 over the real RabbitMQ and PostgreSQL with every part a
process of its own (the sending application, ``condmsg relay``, the evaluator without its
relay, four receivers with their ack relays), each exporting its spans to a file
(``tracing_site/sitecustomize.py``). Its success and its failure each make one connected
trace: the send, its copies' publishes and receives, every ack (its settle or receive
span, then the evaluator's intake), the decision with its verdict and reasons and a link
to every ack, and the notification, success notices or compensations it released."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from condmsg import Verdict
from tests.waiting import wait_for

from .conftest import ROOT, SECRET, Procs, records

pytestmark = [pytest.mark.slow, pytest.mark.rabbitmq, pytest.mark.postgres]

DAY_S = 2.0
SITE = Path(__file__).parent / "tracing_site"
QUEUES = ("qr1", "qr2", "qr3", "qr4")


def _spans(directory: Path) -> list[dict[str, Any]]:
    return [
        json.loads(line)
        for path in sorted(directory.glob("spans-*.jsonl"))
        for line in path.read_text().splitlines()
        if line.strip()
    ]


def _kinds(out: Path) -> list[str | None]:
    return [r["kind"] for r in records(out) if "kind" in r]


def _send(procs: Procs, *, compensation: str = "", notify_success: bool = False) -> str:
    config = {
        "amqp_url": procs.amqp_url,
        "db_url": procs.pg_url,
        "sender": procs.sender,
        "secret": SECRET.decode(),
        "prefix": procs.unique_name,
        "day_s": DAY_S,
        "compensation": compensation,
        "notify_success": notify_success,
    }
    done = subprocess.run(
        [sys.executable, "-m", "tests.e2e.trace_send", json.dumps(config)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return done.stdout.strip().splitlines()[-1]


@pytest.mark.parametrize("verdict", [Verdict.SATISFIED, Verdict.VIOLATED])
def test_example1_is_one_trace_from_the_send_to_its_outcome(
    procs: Procs,
    make_sender: Any,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    verdict: Verdict,
) -> None:
    spans_dir = tmp_path / "spans"
    spans_dir.mkdir()
    monkeypatch.setenv("CONDMSG_TEST_SPANS_DIR", str(spans_dir))
    monkeypatch.setenv("PYTHONPATH", f"{SITE}:{ROOT}")
    failing = verdict is Verdict.VIOLATED
    # Failure: qr3 reads without processing (its condition asks it to process).
    modes = {"qr1": "commit", "qr2": "read", "qr3": "read" if failing else "commit"}
    modes["qr4"] = "commit"
    procs.evaluator("--no-relay")
    outs = {q: procs.receiver(f"{procs.unique_name}.{q}", "alice", modes[q]) for q in QUEUES}
    procs.wait_ready(list(outs.values()), consumers=1)
    procs.relay()  # on the store the evaluator made before it consumed
    cm_id = _send(procs, compensation="cancelled", notify_success=not failing)
    reader = make_sender(procs.pg_url, procs.sender)
    outcome = reader.outcome(cm_id, timeout=40)
    assert outcome is not None and outcome.verdict is verdict, outcome
    after = "compensation" if failing else "success"
    for out in outs.values():
        wait_for(lambda out=out: _kinds(out) == ["original", after], timeout=30)  # type: ignore[misc]
    codes = procs.stop_all()
    assert set(codes.values()) == {0}, codes

    spans = _spans(spans_dir)
    send = next(
        s
        for s in spans
        if s["name"].startswith("send ") and s["attributes"].get("condmsg.cm_id") == cm_id
    )
    trace_id = send["context"]["trace_id"]
    ours = [s for s in spans if s["context"]["trace_id"] == trace_id]
    by_id = {s["context"]["span_id"]: s for s in ours}
    app = by_id[send["parent_id"]]  # the application's span around the send
    assert app["name"] == "book meeting" and app["parent_id"] is None

    def children(parent: dict[str, Any], prefix: str) -> list[dict[str, Any]]:
        return [
            s
            for s in ours
            if s["parent_id"] == parent["context"]["span_id"] and s["name"].startswith(prefix)
        ]

    # The relay (another process) published the copies, one fan-out row, as a child of
    # the send.
    (fanout,) = children(send, "publish ")
    assert fanout["attributes"]["messaging.batch.message_count"] == len(QUEUES)
    originals = [
        s for s in children(send, "receive ") if s["attributes"]["condmsg.kind"] == "original"
    ]
    assert sorted(s["attributes"]["messaging.destination.name"] for s in originals) == sorted(
        f"{procs.unique_name}.{q}" for q in QUEUES
    )
    # Every ack: a READ ack carries its receive span's context, a COMMIT ack its settle's.
    settles = children(send, "settle ")
    assert len(settles) == sum(mode == "commit" for mode in modes.values())
    readers = [
        s
        for s in originals
        if modes[s["attributes"]["messaging.destination.name"].rsplit(".", 1)[1]] == "read"
    ]
    ack_spans = {s["context"]["span_id"] for s in [*settles, *readers]}
    intakes = [s for s in ours if s["name"].startswith("process ")]
    assert sorted(s["parent_id"] for s in intakes) == sorted(ack_spans)
    # The decision: a child of the send, linked to every ack that counted for it (a
    # failure may be decided before the last acks come in: those are kept, not counted).
    counted = {
        s["parent_id"] for s in intakes if s["attributes"]["condmsg.ack.status"] == "counted"
    }
    assert counted == ack_spans if not failing else counted
    (decision,) = children(send, "decide ")
    assert decision["attributes"]["condmsg.verdict"] == verdict.value
    assert list(decision["attributes"]["condmsg.reasons"]) == list(outcome.reasons)
    assert {link["context"]["span_id"] for link in decision["links"]} == counted
    # What the decision released: the outcome notification and, per destination, a
    # success notice or a compensation, received as children of the decision.
    published = children(decision, "publish ")
    assert any(
        s["attributes"]["messaging.destination.name"].endswith(".outcome") for s in published
    )
    released = [
        s for s in children(decision, "receive ") if s["attributes"]["condmsg.kind"] == after
    ]
    assert len(released) == len(QUEUES)
    assert all(s["attributes"]["condmsg.cm_id"] == cm_id for s in released)
    # One trace: every span of it reaches the application's span through its parents.
    for span in ours:
        top = span
        while top["parent_id"] is not None:
            top = by_id[top["parent_id"]]
        assert top is app, span["name"]
