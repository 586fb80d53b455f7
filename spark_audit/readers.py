"""The audit's inputs, the time window (a consistent cut) and the Parquet reader.

Both readers (Parquet here, PostgreSQL in :mod:`spark_audit.jdbc`) return an
:class:`AuditInput` whose frames have exactly the schemas of :mod:`spark_audit.schemas`,
and both pass it through :func:`apply_window`, so a run over an export and a run over the
live store see the same rows for the same window.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import UTC, date, datetime
from pathlib import Path

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from condmsg.archive.layout import (
    ACKS,
    ALL_TABLES,
    ANOMALIES,
    CMS,
    COMPENSATIONS,
    COPIES,
    MANIFEST,
    OUTCOME_COLUMNS,
    SPHERES,
)
from spark_audit import storage
from spark_audit.schemas import SCHEMAS, conform, local_frame

_DECISION_COLUMNS = ("decided_at", "effective_at", "reasons_json", "facts_json", "decided_by")


@dataclass(frozen=True, slots=True)
class Window:
    """The closed cut ``since <= sent_at < until`` (UTC). ``since=None``: from the start.

    ``until`` is fixed when the run starts (default: now), so every table is read as of
    the same instant: later acks, decisions, releases and anomalies are left out.
    """

    until: datetime
    since: datetime | None = None


@dataclass(frozen=True, slots=True)
class AuditInput:
    """The input frames, with the schemas of :data:`spark_audit.schemas.SCHEMAS`."""

    cms: DataFrame
    copies: DataFrame
    acks: DataFrame
    compensations: DataFrame
    anomalies: DataFrame
    spheres: DataFrame

    @property
    def outcomes(self) -> DataFrame:
        return outcomes_of(self.cms)


def outcomes_of(cms: DataFrame) -> DataFrame:
    """The decision columns of the decided CMs (state ``satisfied`` or ``violated``)."""
    return cms.where(F.col("state") != "pending").select(*OUTCOME_COLUMNS)


def sent_in(window: Window, column: str = "sent_at") -> Column:
    """``since <= column < until``: a CM in the window."""
    inside = F.col(column) < F.lit(window.until)
    if window.since is not None:
        inside = inside & (F.col(column) >= F.lit(window.since))
    return inside


def seen_in(window: Window, column: str) -> Column:
    """``since <= column <= until``: an orphan ack received, or an anomaly recorded, in the
    window."""
    inside = F.col(column) <= F.lit(window.until)
    if window.since is not None:
        inside = inside & (F.col(column) >= F.lit(window.since))
    return inside


def decided_after(window: Window) -> Column:
    """No decision visible at ``until`` (none yet, or one taken later)."""
    return F.col("decided_at").isNull() | (F.col("decided_at") > F.lit(window.until))


def apply_window(data: AuditInput, window: Window, *, joined: bool = True) -> AuditInput:
    """The cut of ``data`` at ``window`` (pure: frames in, frames out).

    * CMs sent in ``[since, until)``; a decision taken after ``until`` is not yet visible
      (state ``pending``, decision columns null);
    * copies and compensations of those CMs; a release after ``until`` is not yet visible;
    * acks received by ``until`` for those CMs, plus acks for CMs unknown to the store
      (orphans) received in the window; acks for CMs outside the window are dropped;
    * anomalies recorded in the window;
    * spheres begun in ``[since, until)`` (:func:`cut_spheres`).

    ``joined=False``: the source already kept only the acks, copies and compensations
    of the CMs in the window (the JDBC reader's SQL does); only the per-row rules apply.

    The audit (:func:`spark_audit.job.run_audit`) applies the same rules itself with the
    same predicates, fused into its one join of the acks with the CMs; it accepts a frame
    cut already (the cut is idempotent).
    """
    until = F.lit(window.until)
    decided_late = decided_after(window)
    cms = data.cms.where(sent_in(window)).withColumn(
        "state", F.when(decided_late, F.lit("pending")).otherwise(F.col("state"))
    )
    for name in _DECISION_COLUMNS:
        cms = cms.withColumn(name, F.when(decided_late, F.lit(None)).otherwise(F.col(name)))
    cms = conform(cms, CMS)

    released = F.when(F.col("released_at") <= until, F.col("released_at"))
    anomalies = conform(data.anomalies.where(seen_in(window, "recorded_at")), ANOMALIES)
    spheres = cut_spheres(data.spheres, window)
    if not joined:
        return AuditInput(
            cms=cms,
            copies=data.copies,
            acks=data.acks.where(F.col("received_at") <= until),
            compensations=data.compensations.withColumn("released_at", released),
            anomalies=anomalies,
            spheres=spheres,
        )
    kept = cms.select("cm_id")
    # One join of the acks with every CM's sent_at decides both cases: an ack of a CM in
    # the window, or an orphan (no CM at all) received in the window.
    sent = data.cms.select("cm_id", F.col("sent_at").alias("_cm_sent_at"))
    acks = (
        data.acks.where(F.col("received_at") <= until)
        .join(sent, "cm_id", "left")
        .where(
            F.coalesce(sent_in(window, "_cm_sent_at"), F.lit(False))
            | (F.col("_cm_sent_at").isNull() & seen_in(window, "received_at"))
        )
    )
    copies = data.copies.join(kept, "cm_id", "left_semi")
    compensations = data.compensations.join(kept, "cm_id", "left_semi").withColumn(
        "released_at", released
    )
    return AuditInput(
        cms=cms,
        copies=conform(copies, COPIES),
        acks=conform(acks, ACKS),
        compensations=conform(compensations, COMPENSATIONS),
        anomalies=anomalies,
        spheres=spheres,
    )


def cut_spheres(spheres: DataFrame, window: Window) -> DataFrame:
    """The spheres begun in ``[since, until)`` as they stood at ``until`` (idempotent;
    ``condmsg export`` writes the same cut): a sphere decided after ``until`` has no
    decision yet and the state its sender's requests by ``until`` left it in (``aborted``,
    ``committed`` or ``open``); a commit or an abort requested after ``until`` of a sphere
    undecided then is not visible. A decided sphere keeps its requests as stored: its
    decision followed them, whatever the sender's clock wrote beside the evaluator's."""
    until = F.lit(window.until)
    late = decided_after(window)
    aborted = late & (F.col("aborted_at") <= until)
    committed = late & (F.col("committed_at") <= until)
    state = (
        F.when(aborted, F.lit("aborted"))
        .when(committed, F.lit("committed"))
        .when(late, F.lit("open"))
        .otherwise(F.col("state"))
    )
    hidden = {
        "committed_at": late & (F.col("committed_at") > until),
        "aborted_at": late & (F.col("aborted_at") > until),
        "abort_reason": late & (F.col("aborted_at") > until),
        **dict.fromkeys(
            ("decided_at", "effective_at", "reasons_json", "decided_by", "member_verdicts_json"),
            late,
        ),
    }
    cut = spheres.where(sent_in(window, "begun_at")).withColumn("state", state)
    cut = cut.withColumns({name: F.when(~when, F.col(name)) for name, when in hidden.items()})
    return conform(cut, SPHERES)


def read_parquet(
    spark: SparkSession, location: str | Path, window: Window | None = None
) -> AuditInput:
    """Read the layout written by ``condmsg export`` at ``location`` (a path or any Hadoop
    URI: ``file://``, ``hdfs://``, ``s3a://``; a missing table reads as empty).

    An export partitioned by day (its manifest's ``partitioning``) read for a ``window``
    is read from the days the window needs only: the CMs, copies and compensations of the
    days the CMs were sent in, the acks received and the anomalies recorded from the
    window's first day to its last (an ack of a CM in the window received before the
    window's first day, possible only with the clocks of the sender and the evaluator
    apart across midnight, is then not read), the spheres of the days they were begun in.
    The frames hold the tables' columns only; an export written before spheres were
    exported has no ``spheres`` table and reads as one without spheres.
    """
    root = str(location)
    if not storage.exists(spark, storage.child(root, CMS.name)):
        raise FileNotFoundError(f"{root}: not a condmsg export (no '{CMS.name}' table)")
    manifest = storage.read_json(spark, storage.child(root, MANIFEST)) or {}
    partitioning: dict[str, str] = manifest.get("partitioning") or {}
    frames: dict[str, DataFrame] = {}
    for table in ALL_TABLES:
        schema = SCHEMAS[table.name]
        path = storage.child(root, table.name)
        column = partitioning.get(table.name)
        if not storage.exists(spark, path):
            frame = local_frame(spark, [], schema)
        elif column is None:
            frame = spark.read.schema(schema).parquet(path)
        else:
            with_day = T.StructType([*schema.fields, T.StructField(column, T.DateType())])
            frame = spark.read.schema(with_day).parquet(path)
            if window is not None:
                frame = frame.where(days_of(window, column))
        frames[table.name] = conform(frame, table)
    return AuditInput(**frames)


def export_until(spark: SparkSession, location: str | Path) -> datetime | None:
    """The ``until`` of the export at ``location`` (its manifest's), or None."""
    manifest = storage.read_json(spark, storage.child(str(location), MANIFEST)) or {}
    until = manifest.get("until")
    return datetime.fromisoformat(until) if until else None


def days_of(window: Window, column: str) -> Column:
    """The day partitions (``column``, a date) from the day of ``since`` to the day of
    ``until``: every CM sent, ack received and anomaly recorded in the window is in one."""
    inside = F.col(column) <= F.lit(_utc_day(window.until))
    if window.since is not None:
        inside = inside & (F.col(column) >= F.lit(_utc_day(window.since)))
    return inside


def _utc_day(instant: datetime) -> date:
    """The UTC day of ``instant`` (a naive one is UTC already, as everywhere here)."""
    return (instant.astimezone(UTC) if instant.tzinfo else instant).date()


def with_frames(data: AuditInput, **frames: DataFrame) -> AuditInput:
    """``data`` with some frames replaced (for tests and callers that cache)."""
    return replace(data, **frames)
