"""The pure side of doubted acks: the clock-skew tolerance setting, and the line
``condmsg status`` shows for a decision that late acks contradict."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from condmsg.cm_status import contradiction
from condmsg.core.acks import Ack, AckKind
from condmsg.core.conditions import Destination
from condmsg.core.errors import ConfigError
from condmsg.core.evaluation import evaluate
from condmsg.runtime.settings import DEFAULT_CLOCK_SKEW, ENV_CLOCK_SKEW_MS, Settings

T0 = datetime(2024, 1, 1, tzinfo=UTC)


def test_clock_skew_setting() -> None:
    assert Settings.from_env({}).clock_skew == DEFAULT_CLOCK_SKEW == timedelta(seconds=1)
    assert Settings.from_env({ENV_CLOCK_SKEW_MS: "0"}).clock_skew == timedelta(0)
    assert Settings.from_env({ENV_CLOCK_SKEW_MS: "2500"}).clock_skew == timedelta(seconds=2.5)
    for bad in ("-1", "1.5", "soon", ""):
        with pytest.raises(ConfigError, match=ENV_CLOCK_SKEW_MS):
            Settings.from_env({ENV_CLOCK_SKEW_MS: bad})


def test_the_status_line_for_a_contradicted_decision() -> None:
    condition = Destination("q", pickup_within=timedelta(seconds=1))
    late = Ack(destination="q", kind=AckKind.READ, read_at=T0 + timedelta(milliseconds=500))
    at = T0 + timedelta(seconds=2)
    with_late = evaluate(condition, T0, [late], at)
    line = contradiction("violated", with_late, 1)
    assert line is not None and "would be satisfied, not violated" in line
    assert contradiction("satisfied", with_late, 1) is None
    assert contradiction("pending", with_late, 1) is None
    assert contradiction("violated", evaluate(condition, T0, [], at), 0) is None
