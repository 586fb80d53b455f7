"""Counts in words, for reasons, pages and messages a person reads."""

from __future__ import annotations


def plural(count: int, word: str, words: str | None = None) -> str:
    """``1 member``, ``2 members``, ``1,000 copies`` (``words`` when adding an s is wrong)."""
    return f"{count:,} {word if count == 1 else words or word + 's'}"
