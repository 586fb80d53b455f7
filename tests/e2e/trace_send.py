"""The sending application of the tracing end-to-end test, as a process of its own:
``python -m tests.e2e.trace_send CONFIG_JSON`` sends Example 1 (queues named by the
test, a day scaled to ``day_s`` seconds) inside an application span and prints the CM id.
Its sender runs no relay: another process publishes its copies (``condmsg relay``)."""

from __future__ import annotations

import json
import sys
from datetime import timedelta
from typing import Any

from opentelemetry import trace

from condmsg.core.examples import example1
from condmsg.sending.sender import Sender


def main(config: dict[str, Any]) -> int:
    sender = Sender(
        amqp_url=config["amqp_url"],
        db_url=config["db_url"],
        name=config["sender"],
        secret=config["secret"].encode(),
        create_schema=True,
    )
    prefix = config["prefix"]
    condition = example1(lambda name: f"{prefix}.{name}", timedelta(seconds=config["day_s"]))
    with trace.get_tracer("tests.e2e").start_as_current_span("book meeting"):
        cm_id = sender.send(
            b"meeting",
            condition,
            compensation=config.get("compensation", "").encode() or None,
            notify_success=config.get("notify_success", False),
        )
    sender.engine.dispose()
    print(cm_id)
    return 0


if __name__ == "__main__":
    sys.exit(main(json.loads(sys.argv[1])))
