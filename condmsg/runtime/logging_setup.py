"""Logging of the condmsg services (``condmsg relay``, ``condmsg evaluator``): the level and
the format from the command line or the environment, one handler on the root logger, the
start banner, and third-party loggers kept below the service's own lines.

Two formats: ``text`` (one human-readable line per record) and ``json`` (one JSON object
per line with ``time`` in UTC, ``level``, ``logger``, ``message``, ``exception`` when there
is one, and the record's extra fields), which log shippers read without a parsing rule.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, TextIO

from condmsg import __version__
from condmsg.core.errors import ConfigError
from condmsg.infra import tracing

ENV_LOG_LEVEL = "CONDMSG_LOG_LEVEL"
ENV_LOG_FORMAT = "CONDMSG_LOG_FORMAT"
FORMATS = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

#: What every LogRecord carries; anything else on a record came in through ``extra=``.
_RECORD_FIELDS = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {
    "message",
    "asctime",
}
#: Libraries whose routine lines (APScheduler's "Running job ..." on every sweep, pika's
#: connection chatter, Alembic's "Context impl" at every schema check) would drown the
#: service's own at INFO.
_CHATTY = ("apscheduler", "pika", "alembic")
#: pika logs every failed connection attempt at ERROR, with a traceback (and the URL's
#: parameters), before raising it; the services catch it and say it in one line of their
#: own, once per change, so pika's are kept for --log-level DEBUG.
_RAISES_ANYWAY = ("pika",)


def add_logging_arguments(parser: argparse.ArgumentParser) -> None:
    """``--log-level`` and ``--log-format``; unset, they fall back to the environment."""
    parser.add_argument(
        "--log-level",
        help=f"DEBUG, INFO, WARNING, ERROR (default: {ENV_LOG_LEVEL} or INFO)",
    )
    parser.add_argument(
        "--log-format",
        choices=FORMATS,
        help=f"text lines or one JSON object per line (default: {ENV_LOG_FORMAT} or text)",
    )


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line (a traceback is a field, not more lines)."""

    def format(self, record: logging.LogRecord) -> str:
        document: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            document["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            document["exception"] = record.exc_text
        if record.stack_info:
            document["stack"] = self.formatStack(record.stack_info)
        # The handler formats in the logging thread, inside the span that logged.
        ids = tracing.current_ids()
        if ids is not None:
            document["trace_id"], document["span_id"] = ids
        for key, value in vars(record).items():
            if key not in _RECORD_FIELDS and key not in document:
                document[key] = value
        return json.dumps(document, default=str, ensure_ascii=False)


class _ServiceHandler(logging.StreamHandler[TextIO]):
    """The handler :func:`configure_logging` installs (told apart from others' handlers,
    so that configuring again replaces it instead of doubling every line)."""


def resolve_level(given: str | None, environ: Mapping[str, str] | None = None) -> int:
    """The numeric level named by ``given``, else by ``CONDMSG_LOG_LEVEL``, else INFO."""
    env = os.environ if environ is None else environ
    name = given or env.get(ENV_LOG_LEVEL) or "INFO"
    level = logging.getLevelName(name.strip().upper())
    if not isinstance(level, int):
        source = "--log-level" if given else ENV_LOG_LEVEL
        raise ConfigError(f"{source}: unknown log level {name!r} (DEBUG, INFO, WARNING, ERROR)")
    return level


def resolve_format(given: str | None, environ: Mapping[str, str] | None = None) -> str:
    """``text`` or ``json``: ``given``, else ``CONDMSG_LOG_FORMAT``, else ``text``."""
    env = os.environ if environ is None else environ
    name = (given or env.get(ENV_LOG_FORMAT) or "text").strip().lower()
    if name not in FORMATS:
        raise ConfigError(f"{ENV_LOG_FORMAT}: unknown log format {name!r} (text or json)")
    return name


def configure_logging(
    level: str | None = None,
    log_format: str | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    stream: TextIO | None = None,
) -> int:
    """Send the root logger's records to ``stream`` (default stderr) at ``level`` in
    ``log_format`` (each falling back to the environment); returns the numeric level.

    APScheduler and pika stay at WARNING unless the level is DEBUG. Raises
    :class:`ConfigError` naming the option or variable whose value is not understood.
    """
    numeric = resolve_level(level, environ)
    chosen = resolve_format(log_format, environ)
    root = logging.getLogger()
    for handler in [h for h in root.handlers if isinstance(h, _ServiceHandler)]:
        root.removeHandler(handler)
    handler = _ServiceHandler(sys.stderr if stream is None else stream)
    handler.setFormatter(JsonFormatter() if chosen == "json" else logging.Formatter(TEXT_FORMAT))
    root.addHandler(handler)
    root.setLevel(numeric)
    quiet = logging.DEBUG if numeric <= logging.DEBUG else logging.WARNING
    for name in _CHATTY:
        logging.getLogger(name).setLevel(quiet)
    if numeric > logging.DEBUG:
        for name in _RAISES_ANYWAY:
            logging.getLogger(name).setLevel(logging.CRITICAL)
    return numeric


def log_banner(logger: logging.Logger, service: str, fields: Mapping[str, object]) -> None:
    """The one INFO line a service logs when it starts: the condmsg version and what it
    works on (``fields``, also separate keys of a JSON record). Passwords must already be
    hidden in ``fields``."""
    described = ", ".join(f"{key}={value}" for key, value in fields.items())
    logger.info(
        "condmsg %s %s starting: %s",
        __version__,
        service,
        described,
        extra={"service": service, "version": __version__, **fields},
    )
