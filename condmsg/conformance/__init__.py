"""``condmsg conformance``: a harness that drives a receiver in any language through the
wire protocol with a real sender and evaluator, and judges what its application got
(docs/conformance.md)."""

from condmsg.conformance.config import ConformanceConfig
from condmsg.conformance.report import Report, ScenarioResult
from condmsg.conformance.run import run
from condmsg.conformance.scenarios import ALL as SCENARIOS

__all__ = ["SCENARIOS", "ConformanceConfig", "Report", "ScenarioResult", "run"]
