"""evaluator: decides conditional messages on acks and timeouts, notifies, compensates."""

from evaluator.service import Evaluator

__all__ = ["Evaluator"]
