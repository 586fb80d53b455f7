"""The deployment secret and the services' passwords, from the environment or from files.

Every setting that holds a credential can be given as ``KEY`` or as ``KEY_FILE``, the path
of a file holding it: how Docker and Kubernetes mount secrets (``/run/secrets/<name>``),
so that the value shows neither in the environment (``docker inspect``, ``/proc/*/environ``)
nor in a compose file. A file's one trailing newline is not part of the value (``echo`` and
editors add one). The database and broker passwords can come alone, from
``CONDMSG_DB_PASSWORD_FILE`` and ``CONDMSG_AMQP_PASSWORD_FILE``, filled into the URL.

The deployment secret keys every token (docs/security.md): a known placeholder or a short
value would let anyone who guesses it forge copies, acks and compensations, so
:func:`checked_secret` refuses them, in one line that says how to make a good one.
"""

from __future__ import annotations

import os
import re
import secrets
from collections.abc import Callable, Mapping
from pathlib import Path
from urllib.parse import quote, urlsplit

from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

from condmsg.core.errors import ConfigError

ENV_SECRET = "CONDMSG_SECRET"
ENV_DB_URL = "CONDMSG_DB_URL"
ENV_AMQP_URL = "CONDMSG_AMQP_URL"
ENV_DB_PASSWORD = "CONDMSG_DB_PASSWORD"
ENV_AMQP_PASSWORD = "CONDMSG_AMQP_PASSWORD"
#: What names the file that holds a setting ``KEY``: ``KEY_FILE``.
FILE_SUFFIX = "_FILE"

#: The documented minimum size of the deployment secret (its UTF-8 bytes).
MIN_SECRET_BYTES = 32
#: The size of the secrets ``condmsg secret new`` makes (random bytes, printed as hex).
NEW_SECRET_BYTES = 32
#: A random secret of 32 bytes has far more distinct characters than this, in any encoding.
MIN_DISTINCT_CHARACTERS = 8
HOW_TO_MAKE = "make one with: condmsg secret new (or: openssl rand -hex 32)"

#: Values that stand for "put the real secret here" (compared without case and punctuation):
#: the ones of our docs and .env.example, and the usual ones of other projects' examples.
PLACEHOLDERS = frozenset(
    {
        "changeme",
        "changethis",
        "replaceme",
        "secret",
        "mysecret",
        "yoursecret",
        "deploymentsecret",
        "condmsgsecret",
        "password",
        "example",
        "default",
        "placeholder",
        "todo",
        "test",
    }
)
#: Words that mark a placeholder wherever they stand in a value ("change-me-in-production").
PLACEHOLDER_MARKERS = ("changeme", "changethis", "replaceme", "yoursecret", "placeholder")


def new_secret() -> str:
    """A fresh deployment secret: :data:`NEW_SECRET_BYTES` random bytes as hex digits."""
    return secrets.token_hex(NEW_SECRET_BYTES)


def checked_secret(value: str | bytes, key: str = ENV_SECRET) -> bytes:
    """``value`` as bytes, or :class:`ConfigError` naming ``key`` if it is a known
    placeholder, shorter than :data:`MIN_SECRET_BYTES` or too uniform to be random. The
    message never repeats the value."""
    raw = value.encode() if isinstance(value, str) else value
    folded = re.sub(rb"[^a-z0-9]", b"", raw.lower()).decode("ascii")
    if folded in PLACEHOLDERS or any(marker in folded for marker in PLACEHOLDER_MARKERS):
        raise ConfigError(f"{key} is a placeholder, not a secret; {HOW_TO_MAKE}")
    if len(raw) < MIN_SECRET_BYTES:
        raise ConfigError(
            f"{key} is too short ({len(raw)} bytes; at least {MIN_SECRET_BYTES} random "
            f"bytes are needed); {HOW_TO_MAKE}"
        )
    if len(set(raw)) < MIN_DISTINCT_CHARACTERS:
        raise ConfigError(f"{key} is not random (too few distinct characters); {HOW_TO_MAKE}")
    return raw


def secret_from_env(environ: Mapping[str, str] | None = None) -> bytes | None:
    """The deployment secret of ``CONDMSG_SECRET`` or ``CONDMSG_SECRET_FILE``, checked
    (:func:`checked_secret`); None when neither is set (or the variable is empty, as a
    compose file passes an unset one)."""
    env = os.environ if environ is None else environ
    value = env_value(env, ENV_SECRET)
    return checked_secret(value, _source(env, ENV_SECRET)) if value else None


def db_url_from_env(environ: Mapping[str, str] | None = None) -> str | None:
    """``CONDMSG_DB_URL`` (or ``_FILE``), with the password of ``CONDMSG_DB_PASSWORD`` (or
    ``_FILE``) filled in; None when no URL is set."""
    env = os.environ if environ is None else environ
    return _url_with_password(env, ENV_DB_URL, ENV_DB_PASSWORD, _db_url_with)


def amqp_url_from_env(environ: Mapping[str, str] | None = None) -> str | None:
    """``CONDMSG_AMQP_URL`` (or ``_FILE``), with the password of ``CONDMSG_AMQP_PASSWORD``
    (or ``_FILE``) filled into each of its addresses; None when no URL is set."""
    env = os.environ if environ is None else environ
    return _url_with_password(env, ENV_AMQP_URL, ENV_AMQP_PASSWORD, _amqp_urls_with)


def _url_with_password(
    env: Mapping[str, str], url_key: str, password_key: str, fill: Callable[[str, str, str], str]
) -> str | None:
    """The URL of ``url_key`` with the password of ``password_key`` put in by ``fill(url,
    password, where the password came from)``; the URL alone when no password is given."""
    url = env_value(env, url_key)
    password = env_value(env, password_key)
    if password is None:
        return url
    source = _source(env, password_key)
    if not url:
        raise ConfigError(f"{source} is set without {url_key}")
    return fill(url, password, source)


def _db_url_with(url: str, password: str, source: str) -> str:
    """A SQLAlchemy URL with ``password`` as its user's (SQLAlchemy does the escaping)."""
    try:
        parsed = make_url(url)
    except ArgumentError:
        raise ConfigError(
            f"{ENV_DB_URL} is not a database URL (postgresql+psycopg://user@host/db)"
        ) from None
    if parsed.password is not None:
        raise ConfigError(f"{ENV_DB_URL} has a password and {source} is set; set one")
    return parsed.set(password=password).render_as_string(hide_password=False)


def _amqp_urls_with(urls: str, password: str, source: str) -> str:
    """Each address of a comma-separated list of AMQP URLs with ``password`` as its
    user's, percent-encoded (pika decodes it)."""
    filled = []
    for url in (u.strip() for u in urls.split(",")):
        parts = urlsplit(url)
        if parts.password is not None:
            raise ConfigError(f"{ENV_AMQP_URL} has a password and {source} is set; set one")
        if not parts.username:
            raise ConfigError(
                f"{source} needs a user in {ENV_AMQP_URL} (amqp://user@host:5672/%2F)"
            )
        user_info = f"{parts.username}:{quote(password, safe='')}"
        filled.append(url.replace(f"//{parts.username}@", f"//{user_info}@", 1))
    return ",".join(filled)


def env_value(environ: Mapping[str, str], key: str) -> str | None:
    """The value of ``key``: the variable itself, or the content of the file that
    ``key_FILE`` names, without one trailing newline. :class:`ConfigError` naming the key if
    both are set or the file cannot be read."""
    file_key = key + FILE_SUFFIX
    path = environ.get(file_key)
    if path is None:
        return environ.get(key)
    if environ.get(key) is not None:
        raise ConfigError(f"{key} and {file_key} are both set; set one of them")
    return read_value_file(path, file_key)


def read_value_file(path: str, key: str) -> str:
    """The content of the file at ``path`` (named by setting ``key``), less one trailing
    newline; :class:`ConfigError` naming ``key`` if it is missing, unreadable or empty."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{key}: no file at {path}") from None
    except IsADirectoryError:
        raise ConfigError(f"{key}: {path} is a directory, not a file") from None
    except PermissionError:
        raise ConfigError(f"{key}: cannot read {path} (permission denied)") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{key}: {path} is not UTF-8 text") from None
    except OSError as error:
        raise ConfigError(f"{key}: cannot read {path} ({error.strerror or error})") from None
    text = text.removesuffix("\r\n") if text.endswith("\r\n") else text.removesuffix("\n")
    if not text:
        raise ConfigError(f"{key}: {path} is empty")
    return text


def _source(environ: Mapping[str, str], key: str) -> str:
    """The setting a value came from: ``key_FILE`` if that is set, else ``key``."""
    return key + FILE_SUFFIX if environ.get(key + FILE_SUFFIX) is not None else key
