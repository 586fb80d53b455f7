"""The tests' wait helper: returns what the condition gave, and a timeout names what was
awaited."""

from __future__ import annotations

import itertools
import time

import pytest

from tests.waiting import WaitTimeout, wait_for


def test_returns_the_first_truthy_value() -> None:
    polls = itertools.count()
    assert wait_for(lambda: next(polls) >= 3 and "ready", timeout=5, interval=0) == "ready"


def test_a_timeout_names_the_lambda_and_its_last_value() -> None:
    queue: list[int] = []
    with pytest.raises(WaitTimeout) as raised:
        wait_for(lambda: len(queue) == 2, timeout=0.05, interval=0.01)
    assert str(raised.value) == (
        "timed out after 0.05 s waiting for lambda: len(queue) == 2 (last value: False)"
    )


def test_a_timeout_names_what_the_caller_said() -> None:
    with pytest.raises(WaitTimeout, match=r"waiting for the relay's first batch \(last value: 0\)"):
        wait_for(lambda: 0, timeout=0.01, what="the relay's first batch")


def test_a_timeout_names_a_function_by_its_name() -> None:
    def consumers_started() -> bool:
        return False

    with pytest.raises(WaitTimeout, match=r"waiting for .*consumers_started \("):
        wait_for(consumers_started, timeout=0.01)


def test_a_poll_slower_than_the_deadline_is_not_the_last_one() -> None:
    polls = itertools.count()

    def slow_first_poll() -> bool:
        if next(polls) == 0:
            time.sleep(0.1)  # the first poll itself outlasts the deadline
            return False
        return True

    assert wait_for(slow_first_poll, timeout=0.05, interval=0)
