"""``condmsg console``: serve the web console of a sender store (docs/console.md).

Needs the ``console`` extra (:mod:`condmsg.cli.extras` says so in one line without it).
Binds 127.0.0.1 unless told otherwise; reading needs no write access to the store, and
requeueing or purging parked rows needs ``--token`` / ``CONDMSG_CONSOLE_TOKEN``.
"""

from __future__ import annotations

import argparse
import logging
import os
from typing import Any

from condmsg.cli.extras import MissingExtraError, missing
from condmsg.cli.options import add_db_url, named_db_url
from condmsg.core.errors import ConfigError
from condmsg.infra.urls import redact_url
from condmsg.runtime.exit_codes import OK, add_command

ENV_TOKEN = "CONDMSG_CONSOLE_TOKEN"
#: More ``Host`` names to answer, comma-separated (as ``--allowed-host``, which adds to it).
ENV_ALLOWED_HOSTS = "CONDMSG_CONSOLE_ALLOWED_HOSTS"
#: What installs the ``console`` extra (quoted, since shells expand square brackets).
CONSOLE_INSTALL = "pip install 'condmsg[console]'"
#: The modules of the extra the console imports.
CONSOLE_MODULES = ("starlette", "jinja2", "uvicorn")
ENV_AMQP_URL = "CONDMSG_AMQP_URL"


def register(subparsers: Any) -> None:
    import outbox

    parser = add_command(
        subparsers,
        "console",
        help="serve a web console of a sender store (CMs, trees, outbox, dead letters)",
        description="Serve a web console over a sender store: an overview, the CMs with "
        "filters, each CM's tree and timeline, spheres, the outbox's parked rows and the "
        "dead letters. Reading needs only SELECT on the store; requeue and purge need the "
        f"token (--token or {ENV_TOKEN}).",
    )
    add_db_url(parser, "the sender store")
    parser.add_argument(
        "--receiver-db-url",
        metavar="URL",
        action="append",
        default=[],
        help="a receiver store whose outbox to show too (repeatable)",
    )
    parser.add_argument(
        "--amqp-url",
        metavar="URL",
        help=f"the broker, to look at the dead-letter queue (default: ${ENV_AMQP_URL}; "
        "without either, dead letters are not shown)",
    )
    parser.add_argument(
        "--sender", metavar="NAME", help="whose dead-letter queue (default: the latest CM's)"
    )
    _add_access_options(parser)
    parser.add_argument(
        "--port", type=int, default=8465, help="the port to listen on (default: %(default)s)"
    )
    parser.add_argument(
        "--table",
        metavar="NAME",
        default=outbox.DEFAULT_TABLE_NAME,
        help="the outbox table (default: %(default)s)",
    )
    parser.add_argument(
        "--db-timeout",
        metavar="SECONDS",
        type=_positive_seconds,
        default=5.0,
        help="how long a page waits for a store before it answers 503: PostgreSQL's "
        "connect and statement timeouts, SQLite's busy timeout (default: %(default)s)",
    )
    parser.set_defaults(handler=run, schema_store="sender")


def _add_access_options(parser: argparse.ArgumentParser) -> None:
    """Who may reach the console and what they may do: its bind, names, token, cookies."""
    parser.add_argument(
        "--host",
        default="127.0.0.1",
        help="the address to bind (default: %(default)s); an address other than loopback "
        "needs a token, or --insecure",
    )
    parser.add_argument(
        "--allowed-host",
        metavar="NAME",
        action="append",
        default=[],
        help="a Host name clients reach the console by, e.g. the TLS proxy's (repeatable; "
        f"also ${ENV_ALLOWED_HOSTS}, comma-separated); the bind address and, on loopback, "
        "localhost are always answered, every other name gets 400",
    )
    parser.add_argument(
        "--insecure",
        action="store_true",
        help="allow binding an address other than loopback without a token (anyone who "
        "reaches it reads every page)",
    )
    parser.add_argument(
        "--login-to-read",
        action="store_true",
        help="pages too need the login, not only actions (needs the token; the default "
        "when bound to an address other than loopback); for a loopback console behind a "
        "proxy that does not check who reads",
    )
    parser.add_argument(
        "--secure-cookies",
        action="store_true",
        help="mark the session cookie Secure: for a console reached over HTTPS (a TLS "
        "proxy in front of it)",
    )
    parser.add_argument(
        "--token",
        metavar="TOKEN",
        help=f"the token that allows actions (default: ${ENV_TOKEN}; prefer the variable: "
        "a command line is visible to every user of the machine); none: read-only",
    )


def _positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0 < value <= 3600:
        raise argparse.ArgumentTypeError(f"not a number of seconds in (0, 3600]: {text!r}")
    return value


def run(args: argparse.Namespace) -> int:
    absent = missing(CONSOLE_MODULES)
    if absent:
        raise MissingExtraError(
            f"the console needs the console extra ({', '.join(absent)} not installed); "
            f"install it with: {CONSOLE_INSTALL}"
        )
    import sqlalchemy as sa
    import uvicorn

    from condmsg.console import ConsoleConfig, Store, create_app
    from condmsg.console.deadline import console_engine
    from condmsg.console.hosts import is_loopback
    from condmsg.runtime.credentials import amqp_url_from_env
    from condmsg.runtime.db import describe_db_url
    from condmsg.runtime.logging_setup import configure_logging
    from condmsg.runtime.settings import Settings

    configure_logging()
    token, allowed_hosts, login_to_read = _access(args)
    urls = [named_db_url(args, existing=True), *args.receiver_db_url]
    stores = []
    for index, url in enumerate(urls):
        engine = console_engine(url, args.db_timeout)
        outbox_table = None
        if sa.inspect(engine).has_table(args.table):
            import outbox

            outbox_table = outbox.outbox_table(args.table)
        label = "sender store" if index == 0 else f"receiver store {index}"
        stores.append(Store(f"{label} ({redact_url(describe_db_url(url))})", engine, outbox_table))
    app = create_app(
        ConsoleConfig(
            stores=stores,
            settings=Settings.from_env(),
            sender=args.sender,
            amqp_url=args.amqp_url or amqp_url_from_env(),
            token=token,
            db_timeout_s=args.db_timeout,
            allowed_hosts=allowed_hosts,
            secure_cookies=args.secure_cookies,
            login_to_read=login_to_read,
        )
    )
    log = logging.getLogger("condmsg.console")
    log.info(
        "condmsg console on http://%s:%d/ over %s; actions %s; answers Host %s",
        args.host,
        args.port,
        redact_url(describe_db_url(urls[0])),
        ("enabled (token set)" if token else "disabled (no token)")
        + ("; pages need the login" if login_to_read else ""),
        ", ".join(sorted(allowed_hosts)),
    )
    if not is_loopback(args.host) and not args.secure_cookies:
        log.warning(
            "serving plain HTTP on %s: put a TLS proxy in front and start the console with "
            "--secure-cookies (docs/console.md, Security)",
            args.host,
        )
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
    return OK


def _access(args: argparse.Namespace) -> tuple[str | None, frozenset[str], bool]:
    """The token (checked), the Host names to answer and whether pages need the login, or
    :class:`ConfigError` for a bind that would expose the console without a token, or
    answer no name at all."""
    from condmsg.console.auth import check_token
    from condmsg.console.hosts import allowed_names, is_loopback
    from condmsg.runtime.credentials import env_value

    # The token may come from a mounted file (CONDMSG_CONSOLE_TOKEN_FILE), as secrets do.
    token = args.token or env_value(os.environ, ENV_TOKEN) or None
    if token is not None:
        check_token(token)
    if args.login_to_read and token is None:
        raise ConfigError(f"--login-to-read needs the console's token ({ENV_TOKEN})")
    if not is_loopback(args.host) and token is None and not args.insecure:
        raise ConfigError(
            f"--host {args.host} is not a loopback address: a console reachable from other "
            f"machines needs a token ({ENV_TOKEN}) and a TLS proxy in front; pass "
            "--insecure to serve it without a token anyway"
        )
    given = [*os.environ.get(ENV_ALLOWED_HOSTS, "").split(","), *args.allowed_host]
    names = allowed_names(args.host, given)
    if not names:
        raise ConfigError(
            f"--host {args.host or '(empty)'} listens on every address but no client names "
            "that in its Host header: give the names clients use with --allowed-host NAME "
            f"(or {ENV_ALLOWED_HOSTS})"
        )
    # Beyond loopback every page shows operators' data to whoever reaches the port.
    login_to_read = token is not None and (args.login_to_read or not is_loopback(args.host))
    return token, names, login_to_read
