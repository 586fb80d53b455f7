"""``python -m spark_audit.dist ZIP``: the archive ``spark-submit --py-files`` needs.

It holds the pure-Python packages the audit's driver and its executors import:
``spark_audit``, ``condmsg`` (the model and ``evaluate``) and ``outbox`` (only for the
error classes ``condmsg`` re-exports). The executors' Python needs the audit's
third-party libraries installed as the driver's does (pyspark's own and pyarrow); the
archive carries no compiled code. ``make audit-dist`` writes ``dist/condmsg-audit.zip``.
"""

from __future__ import annotations

import sys
import zipfile
from collections.abc import Iterator, Sequence
from pathlib import Path

#: The packages in the archive.
PACKAGES = ("spark_audit", "condmsg", "outbox")
_ROOT = Path(__file__).resolve().parent.parent


def _files(root: Path) -> Iterator[Path]:
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc":
                yield path


def build(target: Path, root: Path = _ROOT) -> Path:
    """Write the archive to ``target`` (replacing it); returns its path."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as archive:
        for path in _files(root):
            archive.write(path, path.relative_to(root).as_posix())
    return target


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1:
        print("usage: python -m spark_audit.dist ZIP", file=sys.stderr)
        return 2
    print(build(Path(args[0])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
