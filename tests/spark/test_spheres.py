"""The audit's Dependency-Spheres: re-judged in Spark by the rules of ``judge_sphere``, the
disagreements and early compensations reported, old exports without spheres read."""

from __future__ import annotations

import itertools
import json
import shutil
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import sqlalchemy as sa

from condmsg import tables as st
from condmsg.archive.export import export_store
from condmsg.core.conditions import Destination
from condmsg.core.sphere_evaluation import MemberFacts, SphereFacts, judge_sphere
from evaluator.retention import RetentionPolicy, retain
from spark_audit.job import AuditOptions, run_audit
from spark_audit.output import SPHERE_SCHEMAS
from spark_audit.readers import AuditInput, Window, cut_spheres, read_parquet
from spark_audit.transforms.spheres import judge_spheres
from tests.spark.builders import T0, ack_row, at, cm_row, frame
from tests.spark.conftest import SPARK_MARKS

pytestmark = list(SPARK_MARKS)

DEADLINE = at(10_000)
UNTIL = at(60_000)
QUICK = Destination("qa", pickup_within=timedelta(seconds=1))

#: A member's decision: (state, effective instant).
MEMBER_KINDS: dict[str, tuple[str, datetime | None]] = {
    "satisfied early": ("satisfied", at(2_000)),
    "satisfied at the deadline": ("satisfied", DEADLINE),
    "satisfied late": ("satisfied", at(12_000)),
    "violated": ("violated", at(3_000)),
    "pending": ("pending", None),
}
COMMITS = {"never": None, "early": at(1_000), "at": DEADLINE, "late": at(11_000)}
ABORTS = {"no": None, "yes": at(4_000)}


def _cases() -> list[tuple[str, SphereFacts]]:
    """Every commit, abort and multiset of up to two member decisions, as recorded."""
    cases = []
    groups = [
        group
        for size in range(3)
        for group in itertools.combinations_with_replacement(MEMBER_KINDS, size)
    ]
    for n, (commit, abort, group) in enumerate(itertools.product(COMMITS, ABORTS, groups)):
        members = [MemberFacts(f"s{n}-m{i}", *MEMBER_KINDS[kind]) for i, kind in enumerate(group)]
        facts = SphereFacts(
            sphere_id=f"s{n}",
            state="violated",
            deadline=DEADLINE,
            committed_at=COMMITS[commit],
            aborted_at=ABORTS[abort],
            abort_reason="asked" if ABORTS[abort] else None,
            members=members,
        )
        cases.append((f"commit {commit}, abort {abort}, members {list(group)}", facts))
    return cases


def _naive(instant: datetime | None) -> datetime | None:
    return None if instant is None else instant.replace(tzinfo=None)


def test_the_spark_rules_are_judge_sphere_after_the_deadline(spark: Any) -> None:
    cases = _cases()
    spheres = frame(
        spark,
        "spheres",
        [
            {
                "sphere_id": f.sphere_id,
                "sender": "app",
                "begun_at": T0,
                "deadline": f.deadline,
                "members": len(f.members),
                "state": f.state,
                "committed_at": f.committed_at,
                "aborted_at": f.aborted_at,
                "decided_at": UNTIL,
            }
            for _, f in cases
        ],
    )
    cms = frame(
        spark,
        "cms",
        [
            {
                "cm_id": m.cm_id,
                "sphere_id": f.sphere_id,
                "state": m.state,
                "effective_at": m.effective_at,
            }
            for _, f in cases
            for m in f.members
        ],
    )
    spark_says = {
        r["sphere_id"]: r["recomputed_verdict"] for r in judge_spheres(spheres, cms).collect()
    }
    after = DEADLINE + timedelta(days=1)
    expected = {f.sphere_id: judge_sphere(f, after).verdict.value for _, f in cases}
    assert len(spark_says) == len(cases) == 168
    wrong = [name for name, f in cases if spark_says[f.sphere_id] != expected[f.sphere_id]]
    assert wrong == []
    assert set(expected.values()) == {"satisfied", "violated"}


def _member(cm_id: str, sphere_id: str, state: str) -> dict[str, Any]:
    """A CM of ``sphere_id`` decided as its own acks say: satisfied by an ack at 100 ms,
    violated at its 1 s pickup deadline without one."""
    if state == "satisfied":
        row = cm_row(cm_id, QUICK, state=state, decided_at=at(500), effective_at=at(250))
    else:
        row = cm_row(cm_id, QUICK, state=state, decided_at=at(1_250), effective_at=at(1_000))
    return {**row, "sphere_id": sphere_id}


def _sphere(sphere_id: str, state: str, **columns: Any) -> dict[str, Any]:
    return {
        "sphere_id": sphere_id,
        "sender": "app",
        "begun_at": T0 - timedelta(milliseconds=10),
        "deadline": DEADLINE,
        "members": 2,
        "state": state,
        **dict.fromkeys(("committed_at", "aborted_at", "decided_at", "effective_at")),
        **columns,
    }


def _store(spark: Any) -> AuditInput:
    """``agreed``: satisfied, as its members are; ``forged``: recorded satisfied with a
    violated member whose compensation went out before the sphere's decision;
    ``waiting``: committed, undecided; ``short``: satisfied as its two members are, but
    three recorded (one member's CM is missing from the log)."""
    cms = [
        _member("m1", "agreed", "satisfied"),
        _member("m2", "agreed", "satisfied"),
        _member("m3", "forged", "satisfied"),
        _member("m4", "forged", "violated"),
        _member("m5", "waiting", "satisfied"),
        _member("m6", "short", "satisfied"),
        _member("m7", "short", "satisfied"),
        cm_row("loner", QUICK, state="violated", decided_at=at(1_250), effective_at=at(1_000)),
    ]
    read = ("m1", "m2", "m3", "m5", "m6", "m7")
    acks = [ack_row(f"a-{c}", c, "qa", read_at=at(100)) for c in read]
    decided = {"committed_at": at(50), "decided_at": at(1_300), "effective_at": at(1_050)}
    spheres = [
        _sphere("agreed", "satisfied", **decided, reasons_json='["all satisfied"]'),
        _sphere("forged", "satisfied", **decided, reasons_json='["forged"]'),
        _sphere("waiting", "committed", committed_at=at(50), members=1),
        _sphere("short", "satisfied", **decided, members=3, reasons_json='["all satisfied"]'),
    ]
    compensations = [
        {"cm_id": cm, "destination": "qa", "system_generated": True, "released_at": released}
        for cm, released in (("m4", at(1_250)), ("loner", at(1_250)))
    ]
    return AuditInput(
        cms=frame(spark, "cms", cms),
        copies=frame(spark, "copies", []),
        acks=frame(spark, "acks", acks),
        compensations=frame(spark, "compensations", compensations),
        anomalies=frame(spark, "anomalies", []),
        spheres=frame(spark, "spheres", spheres),
    )


def test_a_forged_sphere_verdict_and_an_early_compensation_are_reported(
    spark: Any, tmp_path: Path
) -> None:
    options = AuditOptions(out=tmp_path, window=Window(until=UNTIL), source="spheres")
    result = run_audit(spark, _store(spark), options, progress=lambda _m: None)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["spheres"] == {
        "spheres": 4,
        "decided": 3,
        "satisfied": 3,
        "violated": 0,
        "disagreements": 1,
        "member_mismatches": 1,
        "early_releases": 1,
    }
    assert summary["metrics"]["discrepancies"] == 0  # the members agree with their acks
    assert summary["metrics"]["sphere_discrepancies"] == 1
    assert summary["metrics"]["sphere_member_mismatches"] == 1
    assert summary["metrics"]["sphere_early_releases"] == 1
    failed = {c["name"] for c in summary["checks"] if not c["passed"]}
    assert failed >= {
        "sphere_verdicts_reproducible",
        "sphere_members_complete",
        "no_compensation_before_sphere_decision",
    }
    assert result.status == "fail"

    listed = pq.read_table(tmp_path / "tables" / "sphere_discrepancies").to_pylist()
    wrong, short = sorted(listed, key=lambda row: row["sphere_id"])
    assert (short["sphere_id"], short["agrees"]) == ("short", True)
    assert (short["members_recorded"], short["members_found"]) == (3, 2)
    assert (wrong["sphere_id"], wrong["stored_verdict"]) == ("forged", "satisfied")
    assert (wrong["recomputed_verdict"], wrong["recomputed_reason"]) == (
        "violated",
        "a member violated",
    )
    assert (wrong["members_found"], wrong["members_violated"]) == (2, 1)
    assert wrong["stored_reasons_json"] == '["forged"]'
    (early,) = pq.read_table(tmp_path / "tables" / "sphere_early_releases").to_pylist()
    assert (early["sphere_id"], early["cm_id"]) == ("forged", "m4")
    assert early["released_at"] < early["sphere_decided_at"]
    report = (tmp_path / "report.html").read_text()
    assert "Dependency-Spheres" in report and "forged" in report
    # The schemas a window without spheres is written with are these tables'.
    for name, schema in SPHERE_SCHEMAS.items():
        assert _columns(pq.read_schema(next((tmp_path / "tables" / name).glob("*.parquet")))) == (
            _columns(schema)
        )


def _columns(schema: pa.Schema) -> list[tuple[str, str]]:
    return [(field.name, str(field.type)) for field in schema]


def test_spheres_decided_after_the_cut_are_not_judged(spark: Any, tmp_path: Path) -> None:
    # At 1.2 s neither sphere is decided yet: nothing to judge, and m4's compensation
    # (released at 1.25 s) is not visible.
    options = AuditOptions(out=None, window=Window(until=at(1_200)), source="spheres")
    summary = run_audit(spark, _store(spark), options, progress=lambda _m: None).summary
    assert summary["spheres"] == {
        "spheres": 4,
        "decided": 0,
        "satisfied": 0,
        "violated": 0,
        "disagreements": 0,
        "member_mismatches": 0,
        "early_releases": 0,
    }


def _fill(url: str) -> None:
    """A SQLite store with a CM, a decided sphere and one decided after the export's cut."""
    engine = sa.create_engine(url)
    st.metadata.create_all(engine)
    with engine.begin() as conn:
        conn.execute(st.cms.insert(), [_member("m1", "s1", "satisfied")])
        conn.execute(
            st.spheres.insert(),
            [
                _sphere("s1", "satisfied", committed_at=at(50), decided_at=at(600), members=1),
                _sphere("s2", "violated", aborted_at=at(9_000), decided_at=at(9_100), members=0),
                _sphere("s3", "open", begun_at=at(20_000), members=0),
            ],
        )
        conn.execute(st.acks.insert(), [ack_row("a1", "m1", "qa", read_at=at(100))])
    engine.dispose()


def test_the_export_carries_the_spheres_cut(spark: Any, sqlite_url: str, tmp_path: Path) -> None:
    _fill(sqlite_url)
    out = tmp_path / "export"
    export_store(sqlite_url, out, until=at(5_000))
    manifest = json.loads((out / "_manifest.json").read_text())
    assert manifest["tables"]["spheres"] == 2  # s3 is begun after the cut
    assert manifest["partitioning"]["spheres"] == "begun_day"
    data = read_parquet(spark, out)
    spheres = {r["sphere_id"]: r for r in data.spheres.collect()}
    assert sorted(spheres) == ["s1", "s2"]
    assert spheres["s1"]["state"] == "satisfied"
    # s2 is aborted and decided after the cut: open, with neither visible yet.
    assert spheres["s2"]["state"] == "open"
    assert (spheres["s2"]["aborted_at"], spheres["s2"]["decided_at"]) == (None, None)


def test_a_retention_archive_audits_with_its_spheres(
    spark: Any, sqlite_url: str, tmp_path: Path
) -> None:
    """Retention archives a decided sphere with its members, so the audit of the archive
    judges it from them, as the audit of the store would have."""
    _fill(sqlite_url)
    engine = sa.create_engine(sqlite_url)
    now = T0 + timedelta(days=30)
    policy = RetentionPolicy(older_than=timedelta(days=7), archive=tmp_path / "archive")
    (archived,) = retain(engine, policy, clock=lambda: now)
    engine.dispose()
    assert (archived.rows["spheres"], archived.rows["cms"]) == (2, 1)  # s3 is still open

    data = read_parquet(spark, archived.directory)
    options = AuditOptions(out=None, window=Window(until=now), source="archive")
    summary = run_audit(spark, data, options, progress=lambda _m: None).summary
    assert summary["spheres"] == {
        "spheres": 2,
        "decided": 2,
        "satisfied": 1,
        "violated": 1,
        "disagreements": 0,
        "member_mismatches": 0,
        "early_releases": 0,
    }


def test_an_export_from_before_spheres_audits(spark: Any, sqlite_url: str, tmp_path: Path) -> None:
    _fill(sqlite_url)
    out = tmp_path / "export"
    export_store(sqlite_url, out, until=at(5_000))
    # What an export written before spheres were exported holds: no spheres anywhere.
    shutil.rmtree(out / "spheres")
    manifest = json.loads((out / "_manifest.json").read_text())
    for key in ("tables", "partitioning", "days"):
        del manifest[key]["spheres"]
    (out / "_manifest.json").write_text(json.dumps(manifest))

    data = read_parquet(spark, out, Window(until=at(5_000)))
    assert data.spheres.count() == 0
    options = AuditOptions(out=tmp_path / "audit", window=Window(until=at(5_000)), source="old")
    result = run_audit(spark, data, options, progress=lambda _m: None)
    assert result.summary["spheres"]["spheres"] == 0
    assert result.summary["metrics"]["sphere_discrepancies"] == 0
    assert result.status == "pass"
    for name, schema in SPHERE_SCHEMAS.items():
        empty = pq.read_table(tmp_path / "audit" / "tables" / name)
        assert (empty.num_rows, _columns(empty.schema)) == (0, _columns(schema))


@pytest.mark.parametrize("until", [at(500), at(700)])
def test_the_readers_cut_spheres_as_the_export_does(
    spark: Any, sqlite_url: str, tmp_path: Path, until: datetime
) -> None:
    _fill(sqlite_url)
    export_store(sqlite_url, tmp_path / "cut", until=until)
    export_store(sqlite_url, tmp_path / "whole", until=at(30_000))
    cut = read_parquet(spark, tmp_path / "cut").spheres
    again = cut_spheres(read_parquet(spark, tmp_path / "whole").spheres, Window(until=until))
    assert sorted(cut.collect()) == sorted(again.collect())
