"""The operations docs and the sample Grafana dashboard name the metrics the services
register, and every one of those metrics is documented with a HELP of its own."""

from __future__ import annotations

import json
import re
from pathlib import Path

from prometheus_client import CollectorRegistry

from condmsg.runtime.ops_server import add_process_metrics
from evaluator.metrics import EvaluatorMetrics
from outbox.metrics import RelayMetrics

DOCS = Path(__file__).resolve().parents[2] / "docs"


def _service_registry() -> CollectorRegistry:
    registry = CollectorRegistry()
    EvaluatorMetrics(registry)
    RelayMetrics(registry, table="condmsg_outbox")
    add_process_metrics(registry)
    return registry


def _families() -> dict[str, tuple[str, str]]:
    """condmsg metric name (with _total on counters) -> (type, help)."""
    found = {}
    for family in _service_registry().collect():
        if family.name.startswith("condmsg_"):
            name = f"{family.name}_total" if family.type == "counter" else family.name
            found[name] = (family.type, family.documentation)
    return found


def test_every_metric_is_documented_and_helps_differ() -> None:
    families = _families()
    text = (DOCS / "operations.md").read_text()
    for name, (kind, _help) in families.items():
        assert re.search(rf"`{name}(\{{[a-z, ]+\}})?` \| {kind} \|", text), name
    helps = [help_ for _, help_ in families.values()]
    assert len(set(helps)) == len(helps)
    assert not [n for n in families if n.startswith("condmsg_outbox") and "outbox_outbox" in n]


def test_the_dashboard_uses_only_registered_metrics() -> None:
    dashboard = json.loads((DOCS / "grafana-condmsg.json").read_text())
    exprs = [t["expr"] for panel in dashboard["panels"] for t in panel["targets"]]
    used = {m for expr in exprs for m in re.findall(r"\b(condmsg_[a-z_]+|process_[a-z_]+)", expr)}
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count")}
    series = {
        family.name + suffix
        for family in _service_registry().collect()
        for suffix in suffixes.get(family.type, ("",))
    }
    assert used - series == set()
    for needed in (
        "condmsg_evaluator_decisions_total",
        "condmsg_evaluator_decision_seconds_bucket",
        "condmsg_evaluator_ack_queue_messages",
        "condmsg_evaluator_pending_cms",
        "condmsg_outbox_backlog_rows",
        "condmsg_outbox_failed_rows",
        "condmsg_outbox_published_total",
        "condmsg_outbox_broker_connected",
    ):
        assert needed in used, needed
