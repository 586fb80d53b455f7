"""Where ``condmsg export`` writes: the day partitions of an export directory and its
manifest, on any filesystem pyarrow knows (a local path, ``file://``, ``s3://``, ...).

A day is rewritten whole (its directory is removed, then written again), so a second
export over the same days replaces rather than duplicates; the manifest is written last,
so an export that fails leaves the previous manifest describing the days it wrote.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from condmsg.archive.layout import ALL_TABLES, MANIFEST, PARTITION_COLUMNS, Table, arrow_schema
from condmsg.core.errors import CondmsgError

#: The one file of a day partition.
PART_FILE = "part-00000.parquet"


class ExportLayoutError(CondmsgError):
    """The export directory cannot take this export (an older layout, or a gap)."""


@dataclass(frozen=True, slots=True)
class ExportTarget:
    """An export directory on a pyarrow filesystem."""

    fs: pafs.FileSystem
    root: str

    @classmethod
    def at(cls, location: str | Path) -> ExportTarget:
        text = str(location)
        if "://" in text:
            fs, root = pafs.FileSystem.from_uri(text)
            return cls(fs, root.rstrip("/"))
        return cls(pafs.LocalFileSystem(), os.path.abspath(text))

    def _path(self, *names: str) -> str:
        return "/".join([self.root, *names])

    def manifest(self) -> dict[str, Any] | None:
        path = self._path(MANIFEST)
        if self.fs.get_file_info(path).type != pafs.FileType.File:
            return None
        with self.fs.open_input_stream(path) as stream:
            data: dict[str, Any] = json.loads(stream.read().decode())
        return data

    def write_manifest(self, content: dict[str, Any]) -> None:
        self.fs.create_dir(self.root, recursive=True)
        with self.fs.open_output_stream(self._path(MANIFEST)) as stream:
            stream.write((json.dumps(content, indent=2) + "\n").encode())

    def clear(self, table: Table, start: datetime | None) -> None:
        """Remove ``table``'s days from ``start`` on (None: the whole table)."""
        directory = self._path(table.name)
        if self.fs.get_file_info(directory).type != pafs.FileType.Directory:
            return
        if start is None:
            self.fs.delete_dir(directory)
            return
        prefix = f"{PARTITION_COLUMNS[table.name]}="
        first = start.date().isoformat()
        for info in self.fs.get_file_info(pafs.FileSelector(directory)):
            name = info.base_name
            if name.startswith(prefix) and name[len(prefix) :] >= first:
                self.fs.delete_dir(info.path)

    def write(self, table: Table, batches: Iterator[tuple[str, pa.RecordBatch]]) -> dict[str, int]:
        """Write ``(day, batch)`` pairs into ``table``'s day partitions; returns the rows
        per day. Every table gets its directory, even with no rows (a reader then sees an
        empty table rather than a missing one)."""
        column = PARTITION_COLUMNS[table.name]
        self.fs.create_dir(self._path(table.name), recursive=True)
        writers: dict[str, pq.ParquetWriter] = {}
        rows: dict[str, int] = {}
        try:
            for day, batch in batches:
                if day not in writers:
                    directory = self._path(table.name, f"{column}={day}")
                    self.fs.create_dir(directory, recursive=True)
                    writers[day] = pq.ParquetWriter(
                        f"{directory}/{PART_FILE}", arrow_schema(table), filesystem=self.fs
                    )
                writers[day].write_batch(batch)
                rows[day] = rows.get(day, 0) + batch.num_rows
        finally:
            for writer in writers.values():
                writer.close()
        return rows


def previous_first(
    previous: dict[str, Any], start: datetime, until: datetime, where: str
) -> datetime | None:
    """The first day of the export ``previous`` describes, which an export from
    ``start`` appends to; refused where it would leave a gap or cannot append."""
    if "partitioning" not in previous:
        raise ExportLayoutError(
            f"{where}: not a day-partitioned export; export again without --since"
        )
    if start > datetime.fromisoformat(previous["until"]):
        raise ExportLayoutError(
            f"{where}: --since {start.isoformat()} is after the export's until "
            f"{previous['until']}: the days between would be missing"
        )
    if start >= until:
        raise ExportLayoutError(f"--since {start.isoformat()} is not before --until")
    first = previous.get("since")
    return min(datetime.fromisoformat(first), start) if first else None


def merged_days(
    previous: dict[str, Any] | None, written: dict[str, dict[str, int]], start: datetime | None
) -> dict[str, dict[str, int]]:
    """Rows per table and day: ``previous``'s days before ``start`` and the days just
    ``written``."""
    kept = (previous or {}).get("days", {}) if start is not None else {}
    first = start.date().isoformat() if start is not None else ""
    merged: dict[str, dict[str, int]] = {}
    for table in ALL_TABLES:
        old = {d: n for d, n in kept.get(table.name, {}).items() if d < first}
        merged[table.name] = dict(sorted({**old, **written.get(table.name, {})}.items()))
    return merged
