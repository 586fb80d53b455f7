"""Pipeline throughput with 1, 2 and 4 competing receivers on the destination and 1 and 2
evaluators on the ack queue.

For each combination the pipeline of ``bench._stack`` starts afresh (new schemas, new
queues) and ``--cms`` CMs are sent as fast as one thread can, in batches of ``--batch``
(``send_many``); the figure is CMs/s from the first send to the last outcome, as
``bench.pipeline``'s burst. Beside it, the CPU each stage spent per CM (from ``/proc``;
the receivers together, the evaluators together, the sender's relay, this process,
RabbitMQ and every PostgreSQL process), and the CPU of all of them per second of the
burst: near the machine's core count, the cores are what limits the throughput, not a
lock or a queue.

No target: the curve and its limit are for docs/capacity.md. Run: ``python -m
bench.scale_out [--cms 3000] [--receivers 1 2 4] [--evaluators 1 2]`` (env
``CONDMSG_BENCH_PG_URL``, ``CONDMSG_AMQP_URL``). The last line of stdout is one JSON
object.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from bench._common import emit_result, log, row
from bench._stack import burst, condmsg_stack, exit_on_sigterm
from bench.pipeline import PG_URL, CpuMeter, _stage_pids


def one_setup(receivers: int, evaluators: int, cms: int, batch: int) -> dict[str, Any]:
    with condmsg_stack(PG_URL, receivers=receivers, evaluators=evaluators) as stack:
        meter = CpuMeter(_stage_pids(stack.procs))
        meter.start()
        rate = burst(stack, cms, batch)
        meter.stop()
    spent: dict[str, float] = {}
    for stage, seconds in meter.spent.items():
        group = stage.rstrip("0123456789")  # receiver1, receiver2, ... together
        spent[group] = spent.get(group, 0.0) + seconds
    busy = sum(spent.values()) * rate / cms  # cores busy during the burst
    return {
        "receivers": receivers,
        "evaluators": evaluators,
        "cms_per_s": round(rate, 1),
        "cpu_ms_per_cm": {k: round(v * 1000 / cms, 3) for k, v in spent.items()},
        "cores_busy": round(busy, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cms", type=int, default=3000, help="CMs per burst")
    parser.add_argument("--batch", type=int, default=100, help="CMs per send_many")
    parser.add_argument("--receivers", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--evaluators", type=int, nargs="+", default=[1, 2])
    args = parser.parse_args()
    exit_on_sigterm()
    results = []
    for evaluators in args.evaluators:
        for receivers in args.receivers:
            found = one_setup(receivers, evaluators, args.cms, args.batch)
            log(f"{receivers} receiver(s), {evaluators} evaluator(s): {found}")
            results.append(found)
    stages = sorted({k for r in results for k in r["cpu_ms_per_cm"]})
    print(f"{os.cpu_count()} cores; {args.cms} CMs per burst; CPU ms per CM by stage")
    print(f"{'rx':>3} {'ev':>3} {'CMs/s':>8} {'cores':>6}  " + " ".join(f"{s:>10}" for s in stages))
    for r in results:
        print(
            f"{r['receivers']:>3} {r['evaluators']:>3} {r['cms_per_s']:>8,.0f} "
            f"{r['cores_busy']:>6.2f}  "
            + " ".join(f"{r['cpu_ms_per_cm'].get(s, 0):>10.2f}" for s in stages)
        )
    base = results[0]["cms_per_s"]
    emit_result(
        "scale_out",
        {"cms": args.cms, "batch": args.batch, "cores": os.cpu_count(), "setups": results},
        [
            row(
                f"pipeline burst, {r['receivers']} receivers, {r['evaluators']} evaluators",
                r["cms_per_s"],
                "CMs/s",
                baseline=base,
            )
            for r in results
        ],
    )


if __name__ == "__main__":
    main()
