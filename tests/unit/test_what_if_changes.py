"""The what-if change language: parsing, applying, and one clear error per bad change."""

from __future__ import annotations

from datetime import timedelta

import pytest

from condmsg.core.errors import ConditionError, ConfigError
from spark_audit.changes import parse_changes, sweep_changes
from spark_audit.templates import default_templates

s = timedelta(seconds=1)
#: The paper's Example 1 (nested sets with a count) and Example 2 (an explicit timeout).
TEMPLATES = {t.name: t.condition for t in default_templates()}
MEETING = TEMPLATES["meeting"]
FLIGHT = TEMPLATES["flight"]


def test_set_and_scale_deadlines_everywhere_on_a_destination_and_on_the_root() -> None:
    changed = parse_changes(["process*=2", "pickup@qr3=1h"]).apply(MEETING)
    assert changed.members[0].process_within == 6 * s
    assert changed.members[1].process_within == 14 * s
    assert changed.members[0].pickup_within == timedelta(hours=1)
    assert parse_changes(["pickup@root=90s"]).apply(MEETING).pickup_within == 90 * s


def test_counts_and_the_timeout_keeps_its_margin() -> None:
    assert parse_changes(["min_process=3"]).apply(MEETING).members[1].min_process == 3
    later = parse_changes(["pickup=1m"]).apply(FLIGHT)
    assert (later.pickup_within, later.evaluation_timeout) == (60 * s, 61 * s)
    assert parse_changes(["timeout*=2"]).apply(MEETING).evaluation_timeout == 14 * s


def test_filters_select_cms() -> None:
    changes = parse_changes(["sender=app", "destination=qr3", "since=2026-11-01"])
    assert changes.changes == () and changes.selection.senders == ("app",)
    assert changes.selection.destinations == ("qr3",) and changes.selection.since is not None


@pytest.mark.parametrize(
    "text", ["pickup=-5m", "pickup=0", "process*=0", "min_process=x", "colour=red", "pickup"]
)
def test_a_bad_change_is_one_config_error_naming_it(text: str) -> None:
    with pytest.raises(ConfigError, match="change"):
        parse_changes([text])


def test_a_change_the_condition_cannot_take_names_the_change() -> None:
    with pytest.raises(ConditionError, match=r"min_process=4.*larger than the number of members"):
        parse_changes(["min_process=4"]).apply(MEETING)


def test_a_sweep_is_one_change_per_value() -> None:
    assert [c.text for c in sweep_changes("pickup", ["15m", "48h"])] == ["pickup=15m", "pickup=48h"]
    with pytest.raises(ConfigError):
        sweep_changes("sender", ["a"])
