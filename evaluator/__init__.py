"""evaluator package."""
