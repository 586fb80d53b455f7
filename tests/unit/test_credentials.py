"""The deployment secret and the passwords: placeholders and short secrets are refused in
one line that says how to make one, and every credential can come from a file as Docker
and Kubernetes mount secrets."""

from __future__ import annotations

from pathlib import Path

import pika
import pytest
from sqlalchemy.engine import make_url

from condmsg.cli import main
from condmsg.core.errors import ConfigError
from condmsg.runtime.credentials import (
    MIN_SECRET_BYTES,
    amqp_url_from_env,
    checked_secret,
    db_url_from_env,
    new_secret,
    secret_from_env,
)
from condmsg.runtime.settings import Settings

GOOD = "9c2e7a41f06b3d58e1a4c7f90b2d6e38"
HINT = "condmsg secret new"


@pytest.mark.parametrize(
    "value",
    [
        "change-me",
        "CHANGE_ME",
        "changeme",
        "secret",
        "password",
        "example",
        "change-me-before-going-to-production-0123",  # long, but still the placeholder
        "replace-me-with-32-random-bytes-of-your-own",
    ],
)
def test_a_placeholder_is_refused_however_long(value: str) -> None:
    with pytest.raises(ConfigError, match=f"CONDMSG_SECRET is a placeholder.*{HINT}") as caught:
        secret_from_env({"CONDMSG_SECRET": value})
    assert len(value) < 10 or value not in str(caught.value)  # a secret is never repeated


def test_a_short_or_uniform_secret_is_refused_without_being_repeated() -> None:
    with pytest.raises(ConfigError, match=f"too short \\(5 bytes; at least 32.*{HINT}") as caught:
        checked_secret("hG7#q")
    assert "hG7#q" not in str(caught.value)
    short = GOOD[: MIN_SECRET_BYTES - 1]
    with pytest.raises(ConfigError, match="too short"):
        checked_secret(short)
    assert checked_secret(GOOD[:MIN_SECRET_BYTES]) == GOOD[:MIN_SECRET_BYTES].encode()
    with pytest.raises(ConfigError, match="not random"):
        checked_secret("ab" * 20)


def test_a_new_secret_is_32_random_bytes_in_hex_and_passes() -> None:
    first, second = new_secret(), new_secret()
    assert len(first) == 64 and int(first, 16) >= 0 and first != second
    assert checked_secret(first) == first.encode()


def test_no_secret_is_none_as_compose_passes_an_unset_one() -> None:
    assert secret_from_env({}) is None
    assert secret_from_env({"CONDMSG_SECRET": ""}) is None


def test_the_secret_comes_from_a_file_less_one_trailing_newline(tmp_path: Path) -> None:
    path = tmp_path / "secret"
    path.write_text(GOOD + "\n")
    assert secret_from_env({"CONDMSG_SECRET_FILE": str(path)}) == GOOD.encode()
    path.write_bytes(GOOD.encode() + b"\r\n")
    assert secret_from_env({"CONDMSG_SECRET_FILE": str(path)}) == GOOD.encode()
    path.write_text(GOOD + "\n\n")  # only one newline is the file's end
    assert secret_from_env({"CONDMSG_SECRET_FILE": str(path)}) == GOOD.encode() + b"\n"
    path.write_text("change-me\n")
    with pytest.raises(ConfigError, match="CONDMSG_SECRET_FILE is a placeholder"):
        secret_from_env({"CONDMSG_SECRET_FILE": str(path)})


@pytest.mark.parametrize(
    ("make", "says"),
    [
        (lambda d: d / "missing", "CONDMSG_SECRET_FILE: no file at "),
        (lambda d: d, "CONDMSG_SECRET_FILE: .* is a directory"),
        (lambda d: _written(d / "empty", b""), "CONDMSG_SECRET_FILE: .* is empty"),
        (lambda d: _written(d / "bin", b"\xff\xfe" * 20), "is not UTF-8 text"),
    ],
)
def test_a_secret_file_that_cannot_be_used_is_one_line_naming_the_key(
    tmp_path: Path, make: object, says: str
) -> None:
    path = make(tmp_path)  # type: ignore[operator]
    with pytest.raises(ConfigError, match=says) as caught:
        secret_from_env({"CONDMSG_SECRET_FILE": str(path)})
    assert "\n" not in str(caught.value)


def test_a_setting_and_its_file_both_set_is_an_error(tmp_path: Path) -> None:
    path = _written(tmp_path / "secret", GOOD.encode())
    with pytest.raises(ConfigError, match="CONDMSG_SECRET and CONDMSG_SECRET_FILE are both set"):
        secret_from_env({"CONDMSG_SECRET": GOOD, "CONDMSG_SECRET_FILE": str(path)})
    env = {"CONDMSG_DB_URL": "sqlite://", "CONDMSG_DB_URL_FILE": str(path)}
    with pytest.raises(ConfigError, match="CONDMSG_DB_URL and CONDMSG_DB_URL_FILE"):
        db_url_from_env(env)


def test_the_database_password_file_fills_the_url(tmp_path: Path) -> None:
    password = "p@ss:w/rd%#?"
    env = _password_file(
        tmp_path, "DB", "postgresql+psycopg://condmsg@postgres:5432/condmsg", password
    )
    url = db_url_from_env(env)
    assert url is not None
    parsed = make_url(url)
    assert (parsed.username, parsed.password, parsed.host) == ("condmsg", password, "postgres")
    assert Settings.from_env(env).db_url == url
    with_password = env | {"CONDMSG_DB_URL": "postgresql+psycopg://u:pw@h/db"}
    with pytest.raises(ConfigError, match="has a password and CONDMSG_DB_PASSWORD_FILE"):
        db_url_from_env(with_password)
    with pytest.raises(ConfigError, match="CONDMSG_DB_PASSWORD_FILE is set without"):
        db_url_from_env({"CONDMSG_DB_PASSWORD_FILE": env["CONDMSG_DB_PASSWORD_FILE"]})
    assert db_url_from_env({}) is None


def test_the_broker_password_file_fills_every_address(tmp_path: Path) -> None:
    password = "s3:cr@t/%"
    urls = "amqp://condmsg@rabbit-1:5672/%2F,amqp://condmsg@rabbit-2/%2F"
    env = _password_file(tmp_path, "AMQP", urls, password)
    url = amqp_url_from_env(env)
    assert url is not None
    for one in url.split(","):
        params = pika.URLParameters(one)
        assert params.credentials.username == "condmsg"  # type: ignore[attr-defined]
        assert params.credentials.password == password  # type: ignore[attr-defined]
    assert Settings.from_env(env).amqp_url == url
    no_user = env | {"CONDMSG_AMQP_URL": "amqp://rabbit/%2F"}
    with pytest.raises(ConfigError, match="needs a user in CONDMSG_AMQP_URL"):
        amqp_url_from_env(no_user)
    with pytest.raises(ConfigError, match="has a password and CONDMSG_AMQP_PASSWORD_FILE"):
        amqp_url_from_env(env | {"CONDMSG_AMQP_URL": "amqp://u:p@rabbit/%2F"})


def test_condmsg_secret_new_prints_a_fresh_secret(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["secret", "new"]) == 0
    printed = capsys.readouterr().out.strip()
    assert len(printed) == 64 and checked_secret(printed)


def test_a_command_refuses_a_placeholder_secret_with_exit_2(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("CONDMSG_SECRET", "change-me")
    monkeypatch.setenv("CONDMSG_DB_URL", "sqlite://")
    assert main(["relay", "--status"]) == 2
    said = capsys.readouterr().err
    assert said.count("\n") == 1 and "Traceback" not in said
    assert said.startswith("condmsg relay: CONDMSG_SECRET is a placeholder") and HINT in said


def _password_file(tmp_path: Path, what: str, url: str, password: str) -> dict[str, str]:
    """The environment of ``url`` (CONDMSG_<what>_URL) and a password file for it."""
    path = _written(tmp_path / what, password.encode() + b"\n")
    return {f"CONDMSG_{what}_URL": url, f"CONDMSG_{what}_PASSWORD_FILE": str(path)}


def _written(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path
