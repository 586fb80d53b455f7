"""One log line per change of state for an operation that is retried while it fails: see
:mod:`outbox.repeated_failures`, where it lives so that the relay can use it too."""

from outbox.repeated_failures import REMIND_S, RepeatedFailures, reason_of

__all__ = ["REMIND_S", "RepeatedFailures", "reason_of"]
