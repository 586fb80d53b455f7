"""The outcome document the evaluator writes is the one ``Outcome.to_json`` defines.

``evaluator.actions`` assembles it from JSON it made for the CM row (to not encode the
reasons and facts twice); here both are held to the same document, over generated
conditions and ack histories, and the sender's decoder reads it back unchanged.
"""

from __future__ import annotations

import json
from datetime import timedelta

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from condmsg.core.evaluation import evaluate
from condmsg.core.outcome import Outcome
from condmsg.spheres.store import MemberRow
from evaluator.actions import instants_json, outcome_body, outcome_body_of_row
from tests.unit.strategies import ack_histories, conditions, instants, sent_ats


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_the_evaluators_outcome_body_is_outcome_to_json(data: st.DataObject) -> None:
    condition = data.draw(conditions())
    sent_at = data.draw(sent_ats())
    acks = data.draw(ack_histories(condition, sent_at))
    effective = data.draw(instants(condition, sent_at))
    decided = effective + timedelta(seconds=2)
    result = evaluate(condition, sent_at, acks, effective)
    outcome = Outcome.from_result(
        "9a4c1c52-3c3e-4f57-9d44-2f0c1b3f6e01", result, decided_at=decided, effective_at=effective
    )
    body = outcome_body(
        outcome,
        json.dumps(list(outcome.reasons)),
        json.dumps(list(outcome.facts)),
        instants_json(decided, effective),
    )
    assert json.loads(body) == json.loads(outcome.to_json())
    assert Outcome.from_json(body) == outcome
    if outcome.verdict.value != "pending":
        # A sphere's member decided earlier: its document is rebuilt from its stored row.
        row = MemberRow(
            cm_id=outcome.cm_id,
            sender="s",
            sent_at=sent_at,
            notify_success=False,
            state=outcome.verdict.value,
            decided_at=decided,
            effective_at=effective,
            reasons_json=json.dumps(list(outcome.reasons)),
            facts_json=json.dumps(list(outcome.facts)),
        )
        assert Outcome.from_json(outcome_body_of_row(row)) == outcome
