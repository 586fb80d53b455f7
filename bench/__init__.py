"""Benchmarks: each prints its figures next to a raw baseline measured in the same run."""
