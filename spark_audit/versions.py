"""Version of the audit's own output format (a module without imports, so that both the
package's ``__init__`` and :mod:`spark_audit.summary` can take it from here)."""

from __future__ import annotations

#: Version of ``summary.json`` (see :mod:`spark_audit.summary`).
SUMMARY_VERSION = 1
