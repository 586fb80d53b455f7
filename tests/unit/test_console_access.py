"""Who the console answers and lets in: Host names, the token's length, the login throttle."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest


def test_host_names_are_read_without_port_brackets_or_case() -> None:
    from condmsg.console.hosts import host_name

    assert host_name("LocalHost:8465") == "localhost"
    assert host_name("[::1]:8465") == "::1"
    assert host_name("console.example.com.") == "console.example.com"
    assert host_name("") == ""


def test_the_names_answered_follow_the_bind() -> None:
    from condmsg.console.hosts import LOOPBACK_NAMES, allowed_names, is_loopback

    assert allowed_names("127.0.0.1") == LOOPBACK_NAMES
    assert allowed_names("::1", ["Console.Test"]) == LOOPBACK_NAMES | {"console.test"}
    assert allowed_names("192.0.2.7") == {"192.0.2.7"}
    assert allowed_names("0.0.0.0") == frozenset()
    assert allowed_names("0.0.0.0", ["", "a.test"]) == {"a.test"}
    assert is_loopback("127.0.0.2") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("console.test")


def test_a_short_token_is_refused_without_being_repeated() -> None:
    from condmsg.console.auth import MIN_TOKEN_CHARS, check_token
    from condmsg.core.errors import ConfigError

    with pytest.raises(ConfigError, match="condmsg secret new") as refused:
        check_token("hunter2-hunter2")
    assert "hunter2" not in str(refused.value)
    assert check_token("t" * MIN_TOKEN_CHARS) == "t" * MIN_TOKEN_CHARS


def test_the_throttle_counts_each_address_within_its_window() -> None:
    from condmsg.console.auth import FAILURE_WINDOW_S, LOCKOUT_S, MAX_FAILURES, LoginThrottle

    now = [0.0]
    throttle = LoginThrottle(lambda: now[0])
    for _ in range(MAX_FAILURES - 1):
        throttle.failed("10.0.0.1")
    throttle.failed("10.0.0.2")
    assert throttle.retry_after("10.0.0.1") is None
    throttle.failed("10.0.0.1")
    assert throttle.retry_after("10.0.0.1") == LOCKOUT_S
    assert throttle.retry_after("10.0.0.2") is None  # another address is not locked out
    now[0] += LOCKOUT_S
    assert throttle.retry_after("10.0.0.1") is None
    # Failures older than the window start the count again.
    now[0] += FAILURE_WINDOW_S + 1
    throttle.failed("10.0.0.1")
    assert throttle.retry_after("10.0.0.1") is None
    throttle.succeeded("10.0.0.1")
    for _ in range(MAX_FAILURES - 1):
        throttle.failed("10.0.0.1")
    assert throttle.retry_after("10.0.0.1") is None


def test_the_console_token_may_come_from_a_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from condmsg.cli import console

    token = "t" * 16 + "0123456789abcdef"
    (tmp_path / "token").write_text(token + "\n")
    monkeypatch.delenv(console.ENV_TOKEN, raising=False)
    monkeypatch.setenv(console.ENV_TOKEN + "_FILE", str(tmp_path / "token"))
    args = _args(token=None)
    assert console._access(args)[0] == token


def _args(**given: object) -> argparse.Namespace:
    options: dict[str, object] = {
        "token": None,
        "host": "127.0.0.1",
        "insecure": False,
        "allowed_host": [],
        "login_to_read": False,
    }
    return argparse.Namespace(**(options | given))


def test_pages_need_the_login_off_loopback_or_when_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    from condmsg.cli import console
    from condmsg.core.errors import ConfigError

    monkeypatch.delenv(console.ENV_TOKEN, raising=False)
    monkeypatch.delenv(console.ENV_TOKEN + "_FILE", raising=False)
    token = "t" * 16 + "0123456789abcdef"
    assert console._access(_args(token=token))[2] is False
    assert console._access(_args(token=token, login_to_read=True))[2] is True
    assert console._access(_args(token=token, host="192.0.2.7"))[2] is True
    assert console._access(_args(host="192.0.2.7", insecure=True))[2] is False
    with pytest.raises(ConfigError, match="--login-to-read needs"):
        console._access(_args(login_to_read=True))
