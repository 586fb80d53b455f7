"""Tracing's cost: send and receive throughput with tracing off, API only, and SDK.

Three modes, each measured in a process of its own (OpenTelemetry's tracer provider is
set once per process): ``off``, the OpenTelemetry API made unimportable (as without the
``condmsg[otel]`` extra); ``api``, the API installed and no SDK (what a process has that
installs the extra but configures nothing); ``sdk``, the SDK's ``TracerProvider`` with a
``BatchSpanProcessor`` handing every span to an exporter that drops it (the cost of
recording spans, without any export I/O). Modes alternate, ``--rounds`` times, each round
in a fresh process per mode; figures are medians over rounds.

Per process: (a) send: ``Sender.send_many`` of ``--cms`` CMs to 4 destinations in batches
of 500 (the write, in one transaction per batch; no relay runs meanwhile), CMs per second;
(b) receive: ``--receive`` copies put in a queue first (sent and relayed, not timed, in the
same mode, so that with the SDK they carry a trace context), then ``Receiver.consume``
with one app row per message (as ``bench.send_receive``), messages per second. Each is
measured twice: per second of wall clock, and per second of this process's CPU (user and
system, every thread: the cost tracing adds is the client's CPU, and on a shared machine
the wall clock swings by more than the 3 % the target is about). Target: ``api`` within
3 % of ``off`` per CPU second (ratio >= 0.97), for both; the wall-clock figures and ``sdk``
are reported beside them.

Run: ``python -m bench.tracing [--rounds 3]`` (env ``CONDMSG_BENCH_PG_URL``,
``CONDMSG_AMQP_URL``). The last line of stdout is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Sequence

from ackd.receiver import Receiver
from bench._common import Row, emit_result, fresh_pg_schema, log, row, timed
from bench.send_receive import AMQP_URL, APP, PG_URL, PICKUP, SECRET, Queues, cm_consume, fill
from condmsg import Destination, DestinationSet
from condmsg.core import protocol
from condmsg.infra import tracing
from condmsg.sending.sender import Outgoing, Sender

MODES = ("off", "api", "sdk")
TARGET = 0.97
BATCH = 500
#: A process per mode: ``off`` blocks the API's import before condmsg is imported.
_CHILD = (
    "import sys, json\n"
    "if sys.argv[1] == 'off':\n"
    "    sys.modules['opentelemetry'] = None\n"
    "from bench.tracing import measure\n"
    "print(json.dumps(measure(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))))\n"
)


def install_dropping_sdk() -> None:
    """The SDK's provider, its batch processor, and an exporter that drops every span."""
    from opentelemetry import trace
    from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

    class Dropping(SpanExporter):
        def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
            return SpanExportResult.SUCCESS

    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(Dropping()))
    trace.set_tracer_provider(provider)


def measure(mode: str, cms: int, receive: int) -> dict[str, float]:
    """This process's figures in ``mode``: CMs sent and messages received per second."""
    if mode == "sdk":
        install_dropping_sdk()
    if tracing.active() is not (mode == "sdk"):
        raise RuntimeError(f"mode {mode}: tracing.active() is {tracing.active()}")
    run = uuid.uuid4().hex[:8]
    name = f"bench-tr-{run}"
    dests = [f"bench.tr.{run}.d{i}" for i in range(4)]
    rx = f"bench.tr.{run}.rx"
    condition = DestinationSet(*(Destination(d) for d in dests), pickup_within=PICKUP)
    admin = Queues()
    try:
        with (
            fresh_pg_schema(PG_URL, "bench_trs") as snd_url,
            fresh_pg_schema(PG_URL, "bench_trr") as rcv_url,
        ):
            sender = Sender(
                amqp_url=AMQP_URL, db_url=snd_url, name=name, secret=SECRET, create_schema=True
            )
            try:
                send, send_cpu = _send_rate(sender, condition, cms)
                got, got_cpu = _receive_rate(sender, admin, rx, rcv_url, receive)
                return {"send": send, "send_cpu": send_cpu, "receive": got, "receive_cpu": got_cpu}
            finally:
                sender.engine.dispose()
    finally:
        service = [protocol.ack_queue(name), protocol.outcome_queue(name)]
        admin.delete([*dests, rx, *service, protocol.dead_letter_queue(name)])
        admin.close()


def _send_rate(sender: Sender, condition: DestinationSet, cms: int) -> tuple[float, float]:
    outgoing = Outgoing(payload=b"x" * 256, condition=condition)
    sender.send_many([outgoing] * 100)  # warm: statements prepared, caches filled
    cpu = time.process_time()
    with timed() as sending:
        for start in range(0, cms, BATCH):
            sender.send_many([outgoing] * min(BATCH, cms - start))
    return cms / sending.seconds, cms / (time.process_time() - cpu)


def _receive_rate(
    sender: Sender, admin: Queues, rx: str, rcv_url: str, n: int
) -> tuple[float, float]:
    receiver = Receiver(
        amqp_url=AMQP_URL,
        db_url=rcv_url,
        recipient=f"{sender.name}-rx",
        secret=SECRET,
        create_schema=True,
    )
    APP.metadata.create_all(receiver.engine)
    try:
        with sender.relay() as relay:
            fill(sender, relay, admin, b"x" * 256, rx, 100)
            cm_consume(receiver, rx, 100, 50)  # warm
            fill(sender, relay, admin, b"x" * 256, rx, n)
        cpu = time.process_time()
        seconds = cm_consume(receiver, rx, n, 50)
        return n / seconds, n / (time.process_time() - cpu)
    finally:
        receiver.close()
        receiver.engine.dispose()


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.tracing", description=__doc__)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--cms", type=int, default=3000, help="CMs sent per measurement")
    ap.add_argument("--receive", type=int, default=2000, help="messages received per measurement")
    o = ap.parse_args()
    samples: dict[str, list[float]] = {}
    for r in range(o.rounds):
        for mode in MODES:
            log(f"round {r + 1}/{o.rounds}: {mode} ...")
            done = subprocess.run(
                [sys.executable, "-c", _CHILD, mode, str(o.cms), str(o.receive)],
                capture_output=True,
                text=True,
                check=True,
            )
            for figure, value in json.loads(done.stdout.splitlines()[-1]).items():
                samples.setdefault(f"{figure}_{mode}", []).append(value)
    med = {key: statistics.median(values) for key, values in samples.items()}
    table: list[Row] = []
    for part, what in (("send", "CMs"), ("receive", "msgs")):
        for key, unit in ((f"{part}_cpu", f"{what}/CPU s"), (part, f"{what}/s")):
            off = med[f"{key}_off"]
            target = TARGET if key.endswith("_cpu") else None
            table.append(row(f"{key}, tracing off", off, unit))
            table.append(
                row(
                    f"{key}, API only", med[f"{key}_api"], unit, baseline=off, ratio_at_least=target
                )
            )
            table.append(
                row(f"{key}, SDK, dropping exporter", med[f"{key}_sdk"], unit, baseline=off)
            )
    figures = {key: round(value, 1) for key, value in med.items()}
    emit_result("tracing", {**figures, "rounds": o.rounds, "samples": samples}, table)


if __name__ == "__main__":
    main()
