"""The settings of one conformance run, and the environment the receiver under test gets."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

from condmsg.runtime.credentials import checked_secret, new_secret, secret_from_env
from condmsg.runtime.settings import DEFAULT_QUEUE_TYPE, ENV_DESTINATION_QUEUE_TYPE

#: The environment of the receiver under test (docs/conformance.md, *The contract*).
ENV_AMQP_URL = "CONDMSG_AMQP_URL"
ENV_DB_URL = "CONDMSG_DB_URL"
ENV_PG_URL = "CONDMSG_PG_URL"
ENV_SECRET = "CONDMSG_SECRET"
ENV_QUEUE = "CONDMSG_QUEUE"
ENV_RECIPIENT = "CONDMSG_RECIPIENT"
ENV_INVALID_QUEUE = "CONDMSG_INVALID_QUEUE"
ENV_MAX_ATTEMPTS = "CONDMSG_MAX_ATTEMPTS"
ENV_RETRY_BACKOFF_MS = "CONDMSG_RETRY_BACKOFF_MS"
ENV_SEQUENCE_TIMEOUT_MS = "CONDMSG_SEQUENCE_TIMEOUT_MS"

#: The payloads the application of the receiver under test reacts to.
FAIL_ALWAYS = b"conformance:fail"
FAIL_ONCE = b"conformance:fail-once"
CRASH_BEFORE_COMMIT = b"conformance:crash-before-commit"
CRASH_AFTER_COMMIT = b"conformance:crash-after-commit"

#: What the receiver under test is told, kept small so that a run takes about a minute.
MAX_ATTEMPTS = 3
#: Long enough that a receiver which does not pause (or does not fail when told to) is
#: seen committing well before it, even on a loaded machine.
RETRY_BACKOFF_MS = 500
SEQUENCE_TIMEOUT_MS = 2000
#: SIGKILLs of the receiver in the ``kill-anywhere`` scenario (``--kills``).
DEFAULT_KILLS = 200
#: The type of the queue under test: the harness declares it so (``declare_destination``'s
#: default) and tells the receiver, whose own declaration must match it.
QUEUE_TYPE = DEFAULT_QUEUE_TYPE


@dataclass(frozen=True, slots=True, kw_only=True)
class ConformanceConfig:
    """One run: the receiver under test reads ``queue`` as ``recipient`` with its store at
    ``store_url`` (a SQLAlchemy URL the harness reads and prepares); ``receiver_cmd`` is
    the shell command that starts it. ``sender_db_url`` is the harness's own sender store
    (default: a SQLite file in a temporary directory). ``scale`` multiplies every deadline
    (seconds) for a slow machine. ``only`` names the scenarios to run (all when empty).
    ``fail_fast`` stops at the first failed scenario; ``kills`` is how often the
    ``kill-anywhere`` scenario SIGKILLs the receiver."""

    amqp_url: str = field(repr=False)
    store_url: str = field(repr=False)
    receiver_cmd: str
    queue: str
    recipient: str
    secret: str = field(repr=False)
    sender_db_url: str | None = field(default=None, repr=False)
    invalid_queue: str | None = None
    scale: float = 1.0
    only: tuple[str, ...] = ()
    log_path: str | None = None
    fail_fast: bool = False
    kills: int = DEFAULT_KILLS

    def __post_init__(self) -> None:
        checked_secret(self.secret, "the conformance run's secret")

    @property
    def invalid(self) -> str:
        return self.invalid_queue or f"{self.queue}.invalid"

    def receiver_env(self) -> dict[str, str]:
        """The environment the receiver under test is started with (over the harness's)."""
        return {
            **os.environ,
            ENV_AMQP_URL: self.amqp_url,
            ENV_DB_URL: self.store_url,
            ENV_PG_URL: libpq_url(self.store_url),
            ENV_SECRET: self.secret,
            ENV_QUEUE: self.queue,
            ENV_RECIPIENT: self.recipient,
            ENV_INVALID_QUEUE: self.invalid,
            ENV_MAX_ATTEMPTS: str(MAX_ATTEMPTS),
            ENV_RETRY_BACKOFF_MS: str(RETRY_BACKOFF_MS),
            ENV_SEQUENCE_TIMEOUT_MS: str(SEQUENCE_TIMEOUT_MS),
            ENV_DESTINATION_QUEUE_TYPE: QUEUE_TYPE,
        }


def harness_secret() -> str:
    """The deployment secret of a run: ``CONDMSG_SECRET`` (or ``_FILE``), refused if it is
    a placeholder or short, else a fresh one."""
    secret = secret_from_env()
    return new_secret() if secret is None else secret.decode()


def libpq_url(url: str) -> str:
    """``url`` without SQLAlchemy's ``+driver``: what libpq and other languages' clients
    read (``postgresql+psycopg://u@h/db`` -> ``postgresql://u@h/db``)."""
    return re.sub(r"^(postgres(?:ql)?)\+[a-z0-9_]+://", r"\1://", url)
