"""The kit's stores: SQLite files in a temporary directory, through the real store code.

Each store is a file (the sender's, one per receiver unless receivers share one), so that
every part opens its own connections and transactions as it does on a server; the
directory is in memory where the system has one (``/dev/shm``). Creating a store runs its
Alembic migrations, which takes far longer than a test should: each kind of store is
migrated once per process, into a template file, and a kit's stores are copies of it.
"""

from __future__ import annotations

import atexit
import shutil
import tempfile
from pathlib import Path

from sqlalchemy.engine import Engine

from condmsg.runtime import migrate
from condmsg.runtime.db import make_engine

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


class KitStores:
    """The stores of one kit, by name; :meth:`close` disposes of them and their files."""

    def __init__(self, directory: Path | None = None) -> None:
        self._own = directory is None
        self.directory = _scratch_dir("condmsg-kit-") if directory is None else Path(directory)
        self._engines: dict[str, Engine] = {}

    def engine(self, name: str, kind: str) -> Engine:
        """The engine of the store ``name`` (of ``kind``), created on first use."""
        if name not in self._engines:
            path = self.directory / f"{name}.db"
            if not path.exists():
                shutil.copyfile(_template(kind), path)
            self._engines[name] = make_engine(f"sqlite:///{path}")
        return self._engines[name]

    def close(self) -> None:
        for engine in self._engines.values():
            engine.dispose()
        self._engines.clear()
        if self._own:
            shutil.rmtree(self.directory, ignore_errors=True)
