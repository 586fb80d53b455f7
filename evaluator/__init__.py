"""evaluator: decides conditional messages on acks and timeouts, notifies, compensates."""

from evaluator.config import EvaluatorConfig
from evaluator.service import Evaluator

__all__ = ["Evaluator", "EvaluatorConfig"]
