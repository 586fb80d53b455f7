"""The scenarios of ``condmsg conformance``: each drives the receiver under test through
one situation of the protocol and checks what its application got (the app table), what
its acks made the evaluator decide, and what it moved to its invalid-message queue.

A scenario returns a short note of what it saw, or raises
:class:`~condmsg.conformance.world.NotMet`. The scenarios in :data:`CONCURRENT` touch only
their own CMs and run side by side; those in :data:`SERIAL` kill and start the receiver or
look at the whole run, so they run alone, after the others.
"""

from __future__ import annotations

from collections.abc import Callable

from condmsg.conformance import delivery, kills, malformed, refusals
from condmsg.conformance.world import World

Scenario = Callable[[World], str]

CONCURRENT: dict[str, Scenario] = {
    "plain-message": delivery.plain_message,
    "original": delivery.original,
    "trace-context": delivery.trace_context,
    "named-recipient": delivery.named_recipient,
    "wrong-recipient": delivery.wrong_recipient,
    "duplicates": delivery.duplicates,
    "redelivery-after-commit": delivery.redelivery_after_commit,
    "compensation-after-original": delivery.compensation_after_original,
    "compensation-before-original": delivery.compensation_before_original,
    "success-notice": delivery.success_notice,
    "forged-copy": refusals.forged_copy,
    "unsigned-copy": refusals.unsigned_copy,
    "forged-compensation": refusals.forged_compensation,
    "unsigned-compensation": refusals.unsigned_compensation,
    "kind-swapped-token": refusals.kind_swapped_token,
    "undecodable-payload": refusals.undecodable_payload,
    "malformed-headers": malformed.malformed_headers,
    "sequence-complete": refusals.sequence_complete,
    "sequence-bad-part": refusals.sequence_bad_part,
    "sequence-timed-out": refusals.sequence_timed_out,
    "poison-message": refusals.poison_message,
    "poison-retry": refusals.poison_retry,
    "topic-subscriber": delivery.topic_subscriber,
    "sphere-member": delivery.sphere_member,
}
SERIAL: dict[str, Scenario] = {
    "crash-before-commit": delivery.crash_before_commit,
    "crash-after-commit": delivery.crash_after_commit,
    "kill-anywhere": kills.kill_anywhere,
    "acks-well-formed": delivery.acks_well_formed,
}
ALL = {**CONCURRENT, **SERIAL}
