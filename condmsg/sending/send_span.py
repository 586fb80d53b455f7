"""The attributes of a CM's ``send`` span: the shape of its condition, never its payload.

The names follow OpenTelemetry's messaging semantic conventions where one applies (a
send *creates* messages: the relay, later and maybe in another process, publishes them);
the ``condmsg.*`` ones describe the condition (docs/tracing.md lists them all).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from condmsg.core.conditions import Condition
from condmsg.infra import tracing


def send_attributes(
    cm_id: str, condition: Condition, own: Sequence[Mapping[str, Any]]
) -> dict[str, Any]:
    """The span attributes of sending CM ``cm_id`` under ``condition``; ``own`` are its
    ``condmsg_copy`` rows."""
    return {
        tracing.SYSTEM: tracing.RABBITMQ,
        tracing.OPERATION_TYPE: "create",
        tracing.OPERATION_NAME: "send",
        tracing.CONVERSATION_ID: cm_id,
        tracing.BATCH_COUNT: len(own),
        "condmsg.cm_id": cm_id,
        "condmsg.destinations": [copy["destination"] for copy in own],
        "condmsg.requires": [f"{copy['destination']}={copy['requires']}" for copy in own],
        "condmsg.condition.evaluation_window_ms": int(
            condition.evaluation_window().total_seconds() * 1000
        ),
    }
