"""The receiver's retry policy and redelivery-count keys (pure)."""

from __future__ import annotations

from datetime import timedelta

import pytest

from ackd.attempts import POISON_ID_LENGTH, RetryPolicy, poison_key


def test_the_default_pauses_double_and_stop_at_the_last_attempt() -> None:
    policy = RetryPolicy()
    pauses = [policy.delay_s(n) for n in range(1, policy.max_attempts + 1)]
    assert pauses == pytest.approx([0.2, 0.4, 0.8, 1.6, 0.0])


def test_pauses_are_capped() -> None:
    policy = RetryPolicy(
        max_attempts=100, backoff=timedelta(seconds=1), backoff_max=timedelta(seconds=5)
    )
    assert policy.delay_s(3) == 4.0
    assert policy.delay_s(4) == 5.0
    assert policy.delay_s(99) == 5.0  # no overflow however many attempts


def test_no_pause_before_a_first_attempt() -> None:
    assert RetryPolicy().delay_s(0) == 0.0


@pytest.mark.parametrize(
    "message_id",
    ["x" * (POISON_ID_LENGTH + 1), "with\x00nul", b"\xff\xfenot utf-8", "\udcff"],
)
def test_ids_the_column_cannot_hold_are_keyed_by_their_digest(message_id: str | bytes) -> None:
    key = poison_key(message_id)
    assert key.startswith("sha256:")
    assert len(key) <= POISON_ID_LENGTH
    assert key == poison_key(message_id)


def test_a_plain_id_is_its_own_key() -> None:
    assert poison_key("abc.q.compensation") == "abc.q.compensation"
