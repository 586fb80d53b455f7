"""Atomic archive directories in the audit's Parquet layout (what ``condmsg export`` writes).

An archive appears under its final name complete or not at all. The tables
(``<table>/part-00000.parquet``, Arrow schemas from :mod:`condmsg.archive.layout`) and
``_manifest.json`` are written into a hidden temporary sibling, every file and directory is
fsynced, the directory is renamed into place (atomic within one POSIX filesystem) and the
parent is fsynced so that the rename itself survives a power loss. A crash leaves at most a
``.tmp-*`` sibling, never a partial archive under a final name.
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from condmsg.archive.layout import ALL_TABLES, MANIFEST, arrow_schema, write_manifest
from condmsg.core.errors import CondmsgError

#: The one part file per table, as ``condmsg export`` names it.
PART = "part-00000.parquet"


class ArchiveError(CondmsgError):
    """An archive could not be written (so nothing it was to hold has been deleted)."""


def write_archive(
    parent: Path,
    name: str,
    tables: Mapping[str, Sequence[Sequence[Any]]],
    *,
    source: str,
    until: datetime,
    extra: dict[str, Any] | None = None,
) -> Path:
    """Write ``tables`` (rows per layout table name, columns in layout order) as the
    directory ``parent/name``; returns it. Raises :class:`ArchiveError` and leaves nothing
    behind if any step fails."""
    # pyarrow on first use: the evaluator imports this module for its retention job, and
    # its processes need not pay for pyarrow and numpy at start.
    import pyarrow.parquet as pq

    from condmsg.archive.export import arrow_batches

    final = parent / name
    temporary = parent / f".tmp-{name}-{uuid.uuid4().hex[:8]}"
    written = temporary  # what to remove if a step fails
    try:
        parent.mkdir(parents=True, exist_ok=True)
        if final.exists():
            raise FileExistsError(f"{final} exists already")
        temporary.mkdir()
        counts: dict[str, int] = {}
        for table in ALL_TABLES:
            rows = tables.get(table.name, ())
            directory = temporary / table.name
            directory.mkdir()
            with pq.ParquetWriter(directory / PART, arrow_schema(table)) as writer:
                for batch in arrow_batches(iter([rows]), table):
                    writer.write_batch(batch)
            _fsync(directory / PART)
            _fsync(directory)
            counts[table.name] = len(rows)
        write_manifest(temporary, source=source, since=None, until=until, rows=counts, extra=extra)
        _fsync(temporary / MANIFEST)
        _fsync(temporary)
        # rename(2) onto a non-empty directory fails (ENOTEMPTY): a name clash aborts the
        # batch instead of mixing two archives.
        temporary.rename(final)
        written = final
        _fsync(parent)
    except (OSError, ValueError) as exc:  # pyarrow raises ArrowInvalid (a ValueError) too
        shutil.rmtree(written, ignore_errors=True)
        raise ArchiveError(f"cannot write the archive {final}: {exc}") from exc
    except BaseException:
        shutil.rmtree(written, ignore_errors=True)
        raise
    return final


def _fsync(path: Path) -> None:
    """Flush a file's or a directory's entries to disk (a directory fsync makes the names
    created in it durable)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
