"""Spans recorded by one test: an SDK provider that ``condmsg.infra.tracing`` sees as the
global one for the test only (setting OpenTelemetry's real global provider would turn
tracing on for every later test of the process, for good)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from condmsg.infra import tracing


@contextmanager
def recording(monkeypatch: pytest.MonkeyPatch) -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    monkeypatch.setattr(trace, "get_tracer_provider", lambda: provider)
    monkeypatch.setattr(tracing, "_seen_sdk", False)
    tracing._tracer.cache_clear()
    try:
        yield exporter
    finally:
        tracing._tracer.cache_clear()
        provider.shutdown()
