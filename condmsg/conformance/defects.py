"""Defects the reference receiver can be started with (``python -m
condmsg.conformance.python_receiver --defect NAME``), so that condmsg's tests can check
that ``condmsg conformance`` rejects a receiver that breaks one rule of the protocol. The
names are shared with the Node receiver (interop/node/defects.js) and listed by
``--list-defects``.

Why this is honest: a defect is installed by this module alone, at the start of the
reference receiver's process, by replacing one seam of ``ackd`` (a method of one of its
classes, or a function one of its modules calls through its own namespace) with a
wrapper that breaks that one rule, or by giving ``Receiver`` a setting that does. Nothing
in ``ackd`` knows of defects and no production code imports this module: without
``--defect`` nothing is replaced and the receiver under test is ``ackd`` exactly as it
ships, and with it the variant differs from that in the one place the defect names.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from ackd.rlog import Decision
from condmsg.conformance import seams


@dataclass(frozen=True, slots=True, kw_only=True)
class Defect:
    """One rule broken: ``settings`` are ``Receiver`` keywords it overrides, ``install``
    replaces seams of ``ackd`` (given the receiver's recipient identity)."""

    name: str
    breaks: str
    settings: Mapping[str, Any] = field(default_factory=dict)
    read_mode: bool = False
    fails_once: bool = True
    install: Callable[[str], None] | None = None


# -- the table ---------------------------------------------------------------------------

_DEFECTS = (
    Defect(
        name="refuse-wrong-recipient",
        breaks="moves a copy for another recipient to the invalid-message queue",
        install=seams.refuse_wrong_recipient,
    ),
    Defect(
        name="ignore-fail-once",
        breaks="lets the app commit on the first attempt of a conformance:fail-once message",
        fails_once=False,
    ),
    Defect(
        name="ack-duplicates",
        breaks="sends a COMMIT ack for a duplicate and for a discarded original",
        install=seams.on_rlog_decision(seams.ack_on((Decision.DUPLICATE, Decision.DISCARD))),
    ),
    Defect(
        name="ack-per-part",
        breaks="sends a COMMIT ack for every part of a sequence",
        install=seams.ack_per_part,
    ),
    Defect(
        name="ack-second-transaction",
        breaks="commits the COMMIT acks in a transaction of their own, after the app's",
        install=seams.ack_second_transaction,
    ),
    Defect(
        name="no-header-validation",
        breaks="checks no header rule (version, kind, instants, lengths, reply_to, sequence "
        "bounds, requires)",
        install=seams.no_header_validation,
    ),
    Defect(
        name="no-retry-pause",
        breaks="returns a failed message to its queue at once",
        settings={"retry_backoff": timedelta(0), "retry_backoff_max": timedelta(0)},
    ),
    Defect(
        name="no-original-queue-header",
        breaks="moves deliveries to the invalid-message queue without condmsg-original-queue",
        install=seams.no_original_queue_header,
    ),
    Defect(
        name="wrong-sequence-id",
        breaks="hands a sequence's whole over with part 0's message id, not the sequence id",
        install=seams.on_decide(seams.part_zero_id),
    ),
    Defect(
        name="read-mode",
        breaks="acks the broker before the app has the message, and sends READ acks",
        read_mode=True,
    ),
    Defect(name="no-verify", breaks="checks no token", settings={"secret": None}),
    Defect(
        name="no-cancel-out",
        breaks="delivers an original whose compensation came first",
        install=seams.deliver_on(Decision.DISCARD),
    ),
    Defect(
        name="deliver-duplicates",
        breaks="hands duplicates to the app",
        install=seams.deliver_on(Decision.DUPLICATE),
    ),
    Defect(
        name="no-invalid-queue",
        breaks="drops invalid messages instead of moving them",
        install=seams.no_invalid_queue,
    ),
    Defect(
        name="never-give-up",
        breaks="retries a failing message forever",
        settings={"max_attempts": 1_000_000},
    ),
    Defect(
        name="no-sequence-timeout",
        breaks="keeps incomplete sequences forever",
        settings={"sequence_timeout": timedelta(days=365)},
    ),
    Defect(
        name="ack-before-commit",
        breaks="acks each delivery to the broker before the app has it, so before the commit",
        install=seams.on_decide(seams.ack_at_once),
    ),
    Defect(
        name="wrong-ack-recipient",
        breaks="puts another recipient than its own in its acks",
        install=seams.wrong_ack_recipient,
    ),
    Defect(
        name="drop-trace-context",
        breaks="sends its acks without the trace context of the copies they answer",
        install=seams.drop_trace_context,
    ),
    Defect(
        name="no-compensation",
        breaks="never hands a compensation to the app",
        install=seams.on_rlog_decision(seams.no_compensation),
    ),
)
DEFECTS: dict[str, Defect] = {d.name: d for d in _DEFECTS}
#: The receiver as it ships.
HONEST = Defect(name="honest", breaks="nothing")


def chosen(name: str | None, recipient: str) -> Defect:
    """The defect ``name`` (installed now), or :data:`HONEST` for None."""
    if name is None:
        return HONEST
    defect = DEFECTS[name]
    if defect.install is not None:
        defect.install(recipient)
    return defect
