"""``condmsg audit --what-if`` and ``--sweep``: figures on stdout, what_if.json and a chart,
exit 2 naming a bad change."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from spark_audit.cli import EXIT_ERROR, EXIT_OK, main
from spark_audit.generate import generate
from spark_audit.generate_spec import GenerateSpec
from tests.spark.conftest import SPARK_MARKS

pytestmark = list(SPARK_MARKS)


def test_what_if_and_sweep_from_the_command_line(
    spark: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    generate(spark, GenerateSpec(cms=400, seed=3), tmp_path / "store")
    args = ["--parquet", str(tmp_path / "store"), "--out", str(tmp_path / "out"), "--quiet"]
    code = main([*args, "--what-if", "pickup*=0.25", "--sweep", "pickup=500ms,10s"])
    out = capsys.readouterr().out
    assert code == EXIT_OK
    assert "what-if pickup*=0.25:" in out and "sweep pickup=10s:" in out
    report = json.loads((tmp_path / "out" / "what_if.json").read_text())
    totals = report["totals"]
    assert totals["flips_to_violated"] > 0
    assert f"{totals['judged']} CMs judged" in out
    assert f"violated {totals['violated_before']} -> {totals['violated_after']}" in out
    # The sweep's own baseline is the recorded conditions: the what-if's "before".
    assert report["sweep"]["recorded"]["violated"] == totals["violated_before"]
    assert [p["value"] for p in report["sweep"]["points"]] == ["500ms", "10s"]
    assert "<svg" in (tmp_path / "out" / "what_if.html").read_text()


@pytest.mark.parametrize(
    ("option", "named"),
    [
        (["--what-if", "pickup=-5m"], "pickup=-5m"),
        (["--sweep", "pickup=1h,-5m"], "pickup=-5m"),
        (["--sweep", "pickup"], "--sweep"),
    ],
)
def test_a_bad_change_exits_2_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], option: list[str], named: str
) -> None:
    (tmp_path / "store" / "cms").mkdir(parents=True)
    args = ["--parquet", str(tmp_path / "store"), "--out", str(tmp_path / "out")]
    assert main([*args, *option]) == EXIT_ERROR
    assert named in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
