"""The audit's partitions: one per core in local mode (at least the options' number), more
for many CMs, used by the audit's shuffles whatever ``spark.sql.shuffle.partitions`` says,
and the session's setting restored afterwards."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from spark_audit import job, settings
from spark_audit.cli import main
from spark_audit.generate import generate
from spark_audit.generate_spec import GenerateSpec
from spark_audit.readers import Window, read_parquet
from tests.spark.conftest import SPARK_MARKS

pytestmark = list(SPARK_MARKS)

SHUFFLE = "spark.sql.shuffle.partitions"
SPEC = GenerateSpec(cms=60, seed=5)


@pytest.fixture
def session_at_7(spark: Any) -> Iterator[Any]:
    """The session with ``spark.sql.shuffle.partitions`` at 7 (restored afterwards)."""
    # The test session runs local[2] with spark.default.parallelism=2 (conftest).
    assert spark.sparkContext.defaultParallelism == 2
    before = spark.conf.get(SHUFFLE)
    spark.conf.set(SHUFFLE, "7")
    try:
        yield spark
    finally:
        spark.conf.set(SHUFFLE, before)


@pytest.fixture(scope="module")
def store(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("partitions") / "store"
    generate(spark, SPEC, root)
    return root


def _audit(spark: Any, store: Path, out: Path, partitions: int | None, progress: Any) -> Any:
    options = job.AuditOptions(
        out=out, window=Window(until=SPEC.until), source="test", partitions=partitions
    )
    return job.run_audit(spark, read_parquet(spark, store), options, progress=progress)


def test_one_partition_per_core_in_local_mode_and_more_for_many_cms(session_at_7: Any) -> None:
    assert settings.least_partitions(session_at_7) == 2  # not the session's 7
    assert settings.partitions_for_cms(0, 2) == 2
    assert settings.partitions_for_cms(2 * settings.CMS_PER_PARTITION, 2) == 2
    assert settings.partitions_for_cms(5 * settings.CMS_PER_PARTITION + 1, 2) == 6
    assert settings.partitions_for_cms(5 * settings.CMS_PER_PARTITION + 1, 8) == 8


@pytest.mark.parametrize(("given", "expected"), [(None, "2"), (3, "3")])
def test_the_run_uses_its_partitions_and_restores_the_session(
    session_at_7: Any, store: Path, tmp_path: Path, given: int | None, expected: str
) -> None:
    seen: list[str] = []
    result = _audit(
        session_at_7, store, tmp_path, given, lambda _m: seen.append(session_at_7.conf.get(SHUFFLE))
    )
    assert result.summary["totals"]["cms"] == SPEC.cms
    assert seen and set(seen) == {expected}
    assert session_at_7.conf.get(SHUFFLE) == "7"


def test_the_users_launch_settings_are_kept(
    session_at_7: Any, store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Shuffle partitions and adaptive execution given at launch (``--conf``) are the
    user's: the run keeps them (only its time zone is its own)."""
    users = {SHUFFLE: "7", "spark.sql.adaptive.enabled": "true"}
    given = lambda _spark, key: users.get(key)  # noqa: E731
    monkeypatch.setattr(settings, "launch_setting", given)
    monkeypatch.setattr(job, "launch_setting", given)
    session_at_7.conf.set("spark.sql.session.timeZone", "Europe/Paris")
    seen: list[tuple[str, ...]] = []
    try:
        _audit(
            session_at_7,
            store,
            tmp_path,
            None,
            lambda _m: seen.append(
                tuple(session_at_7.conf.get(key) for key in (*users, "spark.sql.session.timeZone"))
            ),
        )
    finally:
        session_at_7.conf.set("spark.sql.session.timeZone", "UTC")
    assert seen and set(seen) == {("7", "true", "UTC")}


def test_a_failed_run_restores_the_session_too(
    session_at_7: Any, store: Path, tmp_path: Path
) -> None:
    def fail(_message: str) -> None:
        raise RuntimeError("stopped by the test")

    with pytest.raises(RuntimeError, match="stopped by the test"):
        _audit(session_at_7, store, tmp_path, None, fail)
    assert session_at_7.conf.get(SHUFFLE) == "7"
    assert session_at_7.conf.get("spark.sql.adaptive.enabled") == "true"


def test_partitions_below_one_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="at least 1"):
        job.AuditOptions(out=tmp_path, window=Window(until=SPEC.until), source="x", partitions=0)
    with pytest.raises(SystemExit) as exited:
        main(["--parquet", str(tmp_path), "--out", str(tmp_path), "--shuffle-partitions", "0"])
    assert exited.value.code == 2


SPLITS = "spark.sql.files.minPartitionNum"


@pytest.mark.parametrize(
    ("session", "expected"), [(None, str(settings.READ_SPLITS * 2)), ("5", "5")]
)
def test_the_run_reads_in_read_splits_per_partition_unless_the_session_says(
    session_at_7: Any, store: Path, tmp_path: Path, session: str | None, expected: str
) -> None:
    if session is not None:
        session_at_7.conf.set(SPLITS, session)
    try:
        seen: list[str | None] = []
        _audit(
            session_at_7,
            store,
            tmp_path,
            None,
            lambda _m: seen.append(session_at_7.conf.get(SPLITS, None)),
        )
        assert seen and set(seen) == {expected}
        assert session_at_7.conf.get(SPLITS, None) == session
    finally:
        session_at_7.conf.unset(SPLITS)


def test_more_read_splits_make_more_scan_tasks(spark: Any, store: Path) -> None:
    """What the setting is for: the CMs' files read in more, smaller tasks."""

    def tasks() -> int:  # a new frame each time: a frame keeps its first plan
        return int(read_parquet(spark, store).cms.rdd.getNumPartitions())

    # Spark never splits below spark.sql.files.openCostInBytes (4 MB): the test's files
    # are a few kB.
    spark.conf.set("spark.sql.files.openCostInBytes", "1")
    try:
        with settings.audit_settings(spark, 1):
            few = tasks()
        with settings.audit_settings(spark, 4):
            more = tasks()
    finally:
        spark.conf.unset("spark.sql.files.openCostInBytes")
    assert more > few
