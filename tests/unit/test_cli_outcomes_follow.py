"""``condmsg outcomes --follow`` rides out a broker that goes away (DESIGN invariant 8):
the loop that prints the notifications reconnects after its backoff and carries on."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pika.exceptions
import pytest

from condmsg.cli import outcomes
from condmsg.errors import BrokerAuthError, BrokerError


class _Outcome:
    def __init__(self, cm_id: str) -> None:
        self.cm_id = cm_id

    def to_dict(self) -> dict[str, Any]:
        return {"cm_id": self.cm_id}


class _Sender:
    """Each call of ``outcomes`` plays the next script: outcomes, then maybe an error."""

    name = "orders"

    def __init__(self, *scripts: tuple[list[str], BaseException | None]) -> None:
        self._scripts = list(scripts)
        self.calls = 0

    def outcomes(self, *, timeout: float | None = None) -> Iterator[_Outcome]:
        self.calls += 1
        cm_ids, error = self._scripts.pop(0)
        yield from (_Outcome(cm_id) for cm_id in cm_ids)
        if error is not None:
            raise error


def test_following_resumes_after_the_broker_went_away(capsys: pytest.CaptureFixture[str]) -> None:
    sender = _Sender(
        (["a"], pika.exceptions.StreamLostError("Transport indicated EOF")),
        ([], BrokerError("cannot reach RabbitMQ at amqp://127.0.0.1:5672/: connection refused")),
        (["b", "c"], None),
    )
    outcomes._print_outcomes(sender, timeout=1.0)  # type: ignore[arg-type]
    said = capsys.readouterr()
    assert [json.loads(line)["cm_id"] for line in said.out.splitlines()] == ["a", "b", "c"]
    assert sender.calls == 3
    lines = said.err.splitlines()
    assert len(lines) == 2, said.err
    assert lines[0].startswith("condmsg outcomes: following the outcomes of 'orders' paused")
    assert "RabbitMQ cannot be reached (StreamLostError" in lines[0]
    assert lines[1].startswith("condmsg outcomes: following the outcomes of 'orders' resumes")


def test_refused_credentials_end_following() -> None:
    sender = _Sender(([], BrokerAuthError("RabbitMQ refused the credentials")))
    with pytest.raises(BrokerAuthError):
        outcomes._print_outcomes(sender, timeout=1.0)  # type: ignore[arg-type]
