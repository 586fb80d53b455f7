"""Counts and errors in words, for reasons, pages and messages a person reads."""

from __future__ import annotations


def plural(count: int, word: str, words: str | None = None) -> str:
    """``1 member``, ``2 members``, ``1,000 copies`` (``words`` when adding an s is wrong)."""
    return f"{count:,} {word if count == 1 else words or word + 's'}"


def first_line(exc: BaseException) -> str:
    """An error's own message, first line only: a driver's (SQLAlchemy keeps it as ``orig``)
    rather than the wrapper's, without the SQL and hints drivers append on further lines."""
    orig = getattr(exc, "orig", None)
    text = str(orig if orig is not None else exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
