"""The audit from a notebook or another program: :func:`audit` returns frames.

    import spark_audit
    run = spark_audit.audit(spark, "s3a://bucket/condmsg-export", since=datetime(2026, 11, 1))
    run.status                        # "pass" | "warn" | "fail"
    run.cms.where("NOT agrees")       # every CM in the window, judged
    run.tables["late_acks"]           # the detail tables, as frames
    run.spheres.where("NOT agrees")   # every decided sphere in the window, judged again

Files are written only when ``out`` is given (the same tables, ``summary.json`` and
``report.html`` as ``condmsg audit``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from condmsg.core.timeutil import utcnow
from spark_audit import storage
from spark_audit.checks import DEFAULT_CHECKS, CheckSpec
from spark_audit.job import AuditOptions, run_audit
from spark_audit.readers import (
    AuditInput,
    Window,
    apply_window,
    export_until,
    read_parquet,
    sent_in,
)
from spark_audit.reevaluate.recompute import judge_cut
from spark_audit.settings import audit_settings, least_partitions
from spark_audit.transforms.conditions import plan_set
from spark_audit.transforms.enrich import cm_ranks, cut_cms, enrich_acks
from spark_audit.transforms.spheres import judge_spheres


@dataclass(frozen=True, slots=True)
class Audit:
    """An audit's outcome as frames.

    ``cms``: every CM in the window with ``cm_id, sender, shape``, its stored ``state``,
    ``recomputed_verdict``, ``agrees``, ``path`` (how it was judged), ``late_acks``,
    ``flagged``, ``multi``, ``compensated``, ``stale`` and the per-destination deadline
    columns (lazy: computed again by each action; cache it to reuse it). ``tables``: every
    table ``condmsg audit`` writes (the small ones held by the driver). ``spheres``: every
    sphere decided in the window with its stored and recomputed verdicts and ``agrees``
    (:func:`spark_audit.transforms.spheres.judge_spheres`; lazy too).
    """

    status: str
    summary: dict[str, Any]
    window: Window
    cms: DataFrame
    tables: Mapping[str, DataFrame]
    spheres: DataFrame


def audit(
    spark: SparkSession,
    source: str | Path | AuditInput,
    *,
    since: datetime | None = None,
    until: datetime | None = None,
    out: str | Path | None = None,
    checks: tuple[CheckSpec, ...] = DEFAULT_CHECKS,
    stale_grace: timedelta = timedelta(minutes=1),
    partitions: int | None = None,
) -> Audit:
    """Audit ``source`` (an export's location, a path or any Hadoop URI, or frames already
    read: :func:`spark_audit.readers.read_parquet`, :func:`spark_audit.jdbc.read_jdbc`)
    over ``[since, until)`` (UTC; ``until`` defaults to the export's, else now)."""
    if until is None and not isinstance(source, AuditInput):
        until = export_until(spark, source)
    window = Window(until=until or utcnow(), since=since)
    if isinstance(source, AuditInput):
        data, described = source, "frames"
    else:
        data = read_parquet(spark, source, window)
        described = storage.qualified(spark, str(source))
    options = AuditOptions(
        out=out,
        window=window,
        source=described,
        checks=checks,
        stale_grace=stale_grace,
        partitions=partitions,
    )
    result = run_audit(spark, data, options, progress=lambda _message: None)
    cms = judged_cms(spark, data, window, stale_grace=stale_grace, partitions=partitions)
    cut = apply_window(data, window)
    spheres = judge_spheres(cut.spheres, cut.cms)
    return Audit(result.status, result.summary, window, cms, result.tables, spheres)


def judged_cms(
    spark: SparkSession,
    data: AuditInput,
    window: Window,
    *,
    stale_grace: timedelta = timedelta(minutes=1),
    partitions: int | None = None,
) -> DataFrame:
    """Every CM of ``data`` in ``window`` judged as the audit judges it
    (:func:`spark_audit.reevaluate.recompute.judge_cut`), named: ``cm_id``, ``sender`` and
    ``shape`` instead of the audit's numbers for them. Decoding the conditions and
    numbering CMs that share a 64-bit key run now (two small jobs); the rest is lazy."""
    least = partitions or least_partitions(spark)
    with audit_settings(spark, least):
        plans = plan_set(data.cms, chosen=sent_in(window), senders=True)
        cut = cut_cms(data.cms, plans, window, least)
        ranks = cm_ranks(cut)
    if ranks is not None:
        cut = cut_cms(data.cms, plans, window, least, ranks)
    acks = enrich_acks(data.acks, data.compensations, cut, plans, window, text=plans.python)
    judged = judge_cut(cut, acks, plans, until=window.until, stale_grace=stale_grace)
    senders = F.array(*(F.lit(name) for name in plans.senders))
    named = judged.join(cut.select("cm_key", "cm_rank", "cm_id"), ["cm_key", "cm_rank"]).join(
        plans.lookup("shape"), "plan_id", "left"
    )
    return named.select(
        "cm_id",
        F.get(senders, F.col("sender_code")).alias("sender"),
        "shape",
        *(c for c in judged.columns if c not in ("cm_key", "cm_rank", "n_cm", "sender_code")),
    )
