"""The kit's stores: SQLite files in a temporary directory, through the real store code.

Each store is a file (the sender's, one per receiver unless receivers share one), so that
every part opens its own connections and transactions as it does on a server; the
directory is in memory where the system has one (``/dev/shm``). Creating a store runs its
Alembic migrations, which takes far longer than a test should: each kind of store is
migrated once per process, into a template file, and a kit's stores are copies of it.

SQLAlchemy compiles each statement once per engine, which costs a new kit more than
everything its test then does; so engines outlive their kit: a kit that closes hands its
engines back (their connections closed), and the next kit's stores open their files
through them (the engine connects to whatever file its slot names now).
"""

from __future__ import annotations

import atexit
import shutil
import sqlite3
import tempfile
import threading
from pathlib import Path

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from condmsg.runtime import migrate
from condmsg.runtime.db import SQLITE_BUSY_TIMEOUT_MS, configure_sqlite, make_engine

_SHM = Path("/dev/shm")
_templates: dict[str, Path] = {}
_template_dir: Path | None = None


def _scratch_dir(prefix: str) -> Path:
    base = _SHM if _SHM.is_dir() else None
    return Path(tempfile.mkdtemp(prefix=prefix, dir=base))


def _template(kind: str) -> Path:
    """A store of ``kind`` (``sender`` or ``receiver``) at this release's schema."""
    global _template_dir
    if kind not in _templates:
        if _template_dir is None:
            _template_dir = _scratch_dir("condmsg-kit-templates-")
            atexit.register(shutil.rmtree, _template_dir, True)
        path = _template_dir / f"{kind}.db"
        engine = make_engine(f"sqlite:///{path}")
        try:
            migrate.upgrade(engine, kind)
        finally:
            # Closing the last connection folds the write-ahead log into the file, so
            # that a copy of the file alone is the whole store.
            engine.dispose()
        _templates[kind] = path
    return _templates[kind]


class _Slot:
    """An engine whose connections open the file the slot names at the time."""

    def __init__(self) -> None:
        self.path = ""
        self.engine = sa.create_engine(
            "sqlite:///condmsg-kit-store.db",  # for its dialect and pool; never opened
            creator=self._connect,
            poolclass=sa.pool.QueuePool,
        )
        configure_sqlite(self.engine)

    def _connect(self) -> sqlite3.Connection:
        return sqlite3.connect(
            self.path, timeout=SQLITE_BUSY_TIMEOUT_MS / 1000, check_same_thread=False
        )


#: Engines of closed kits, by store kind, for the next kits (kits may live in threads).
_free: dict[str, list[_Slot]] = {}
_free_lock = threading.Lock()


class KitStores:
    """The stores of one kit, by name; :meth:`close` disposes of them and their files."""

    def __init__(self, directory: Path | None = None) -> None:
        self._own = directory is None
        self.directory = _scratch_dir("condmsg-kit-") if directory is None else Path(directory)
        self._slots: dict[str, tuple[str, _Slot]] = {}

    def engine(self, name: str, kind: str) -> Engine:
        """The engine of the store ``name`` (of ``kind``), created on first use."""
        if name not in self._slots:
            path = self.directory / f"{name}.db"
            if not path.exists():
                shutil.copyfile(_template(kind), path)
            with _free_lock:
                free = _free.get(kind)
                slot = free.pop() if free else None
            slot = slot or _Slot()
            slot.path = str(path)
            self._slots[name] = (kind, slot)
        return self._slots[name][1].engine

    def close(self) -> None:
        for kind, slot in self._slots.values():
            slot.engine.dispose()
            with _free_lock:
                _free.setdefault(kind, []).append(slot)
        self._slots.clear()
        if self._own:
            shutil.rmtree(self.directory, ignore_errors=True)
