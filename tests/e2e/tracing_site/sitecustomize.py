"""Test-only: with ``CONDMSG_TEST_SPANS_DIR`` set, every Python process started with this
directory on ``PYTHONPATH`` installs the OpenTelemetry SDK and writes each span it ends to
``<dir>/spans-<pid>.jsonl``, one JSON object per line (``ReadableSpan.to_json``), at
once (a simple processor: nothing is buffered, so a process stopped by SIGTERM loses no
span). Applications configure the SDK their own way (docs/tracing.md).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from pathlib import Path

_DIR = os.environ.get("CONDMSG_TEST_SPANS_DIR")


def _install(directory: Path) -> None:
    from opentelemetry import trace
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
    from opentelemetry.sdk.trace.export import (
        SimpleSpanProcessor,
        SpanExporter,
        SpanExportResult,
    )

    class JsonLinesExporter(SpanExporter):
        def __init__(self, path: Path) -> None:
            self._path = path

        def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
            with self._path.open("a") as out:
                for span in spans:
                    out.write(span.to_json(indent=None) + "\n")
            return SpanExportResult.SUCCESS

    name = " ".join(sys.argv[:3])[-120:] or "python"
    provider = TracerProvider(resource=Resource.create({"service.name": name}))
    provider.add_span_processor(
        SimpleSpanProcessor(JsonLinesExporter(directory / f"spans-{os.getpid()}.jsonl"))
    )
    trace.set_tracer_provider(provider)


if _DIR:
    _install(Path(_DIR))
