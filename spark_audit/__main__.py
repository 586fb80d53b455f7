"""``python -m spark_audit`` / ``spark-submit spark_audit/__main__.py``: run the audit."""

from __future__ import annotations

import sys

from spark_audit.cli import main

if __name__ == "__main__":
    sys.exit(main())
