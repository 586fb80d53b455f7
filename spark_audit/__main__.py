"""``python -m spark_audit`` / ``spark-submit spark_audit/__main__.py``: run the audit."""

from __future__ import annotations

import sys
from pathlib import Path

if __name__ == "__main__" and not __package__:
    # Run as a script (spark-submit): Python put this file's directory first on the path,
    # where the package's modules would shadow top-level ones of the same name; the
    # package itself comes from --py-files or the installed distribution.
    here = str(Path(__file__).resolve().parent)
    sys.path[:] = [p for p in sys.path if p and str(Path(p).resolve()) != here]

from spark_audit.cli import main

if __name__ == "__main__":
    sys.exit(main())
