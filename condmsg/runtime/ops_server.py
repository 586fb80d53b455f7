"""The operations endpoint of a service: ``/metrics``, ``/healthz`` and ``/readyz`` on one
port.

prometheus_client's own ``start_http_server`` serves metrics only, and its thread cannot
be stopped; this small server serves the three paths from a ``ThreadingHTTPServer`` in a
daemon thread and stops with the service. A check is a function that returns None when
all is well, else a one-line reason: 200 ``ok`` or 503 with the reason as the body.

``/healthz`` (liveness) says whether the process's loop still runs, so an orchestrator
restarts a process that hangs; ``/readyz`` (readiness) whether it can do its work now
(connected to RabbitMQ, the store reachable), which an outage of either makes false
without any restart helping.
"""

from __future__ import annotations

import logging
import platform
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Gauge,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.openmetrics.exposition import CONTENT_TYPE_LATEST as OPENMETRICS_TYPE
from prometheus_client.openmetrics.exposition import generate_latest as openmetrics_latest

from condmsg import __version__
from condmsg.core.errors import ConfigError

log = logging.getLogger(__name__)

#: None when healthy, else why not (one line).
Check = Callable[[], str | None]
#: The media type a scraper asks for to get the OpenMetrics format.
OPENMETRICS = "application/openmetrics-text"


def add_process_metrics(registry: CollectorRegistry) -> None:
    """The process's own series in ``registry``: ``process_*`` (CPU, memory, open files),
    ``python_info``, and ``condmsg_build_info`` (1, labelled with the versions), for a
    registry that a process of its own serves."""
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    build = Gauge(
        "condmsg_build_info",
        "Always 1; the labels name the condmsg and Python versions of this process",
        ["version", "python"],
        registry=registry,
    )
    build.labels(version=__version__, python=platform.python_version()).set(1)


def serve_ops(
    registry: CollectorRegistry, port: int | None, *, live: Check, ready: Check
) -> OpsServer | None:
    """With a ``port``: the process metrics added to ``registry`` and an :class:`OpsServer`
    started on it (stop it with the service); None without one."""
    if port is None:
        return None
    add_process_metrics(registry)
    return OpsServer(registry, port=port, live=live, ready=ready).start()


class OpsServer:
    """Serves ``registry`` at ``/metrics`` and the checks at ``/healthz`` (``live``) and
    ``/readyz`` (``ready``) on ``host:port`` (port 0: any free one, see :attr:`port`)
    between :meth:`start` and :meth:`stop`."""

    def __init__(
        self,
        registry: CollectorRegistry,
        *,
        port: int,
        live: Check,
        ready: Check,
        host: str = "0.0.0.0",
    ) -> None:
        self._registry = registry
        self._checks = {"/healthz": live, "/readyz": ready}
        try:
            self._server = ThreadingHTTPServer((host, port), self._handler_class())
        except OSError as exc:
            raise ConfigError(
                f"cannot serve metrics and health checks on port {port}: {exc.strerror or exc}"
            ) from None
        # Request threads must not keep a stopping process alive.
        self._server.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def start(self) -> OpsServer:
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="condmsg-ops-http", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and close the port (waits for the request being answered)."""
        if self._thread is not None:
            self._server.shutdown()
            self._thread.join(5.0)
            self._thread = None
        self._server.server_close()

    def __enter__(self) -> OpsServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def answer(self, path: str, accept: str = "") -> tuple[int, str, bytes]:
        """Status, content type and body for a GET of ``path`` (the query is ignored).

        ``/metrics`` answers in the OpenMetrics format when ``accept`` (the request's
        ``Accept`` header) asks for it, as Prometheus does: only that format carries
        exemplars (a histogram's link to a trace, docs/tracing.md); else in Prometheus'
        text format."""
        path = path.split("?", 1)[0]
        if path == "/metrics":
            if OPENMETRICS in accept:
                body = openmetrics_latest(self._registry)  # type: ignore[no-untyped-call]
                return 200, OPENMETRICS_TYPE, body
            return 200, CONTENT_TYPE_LATEST, generate_latest(self._registry)
        check = self._checks.get(path)
        if check is None:
            return 404, "text/plain; charset=utf-8", b"not found: try /metrics, /healthz, /readyz\n"
        try:
            reason = check()
        except Exception as exc:  # a check that breaks says so instead of hanging up
            log.exception("the %s check failed", path)
            reason = f"the check failed: {exc}"
        if reason is None:
            return 200, "text/plain; charset=utf-8", b"ok\n"
        line = " ".join(reason.split())  # one line, whatever the reason's text holds
        return 503, "text/plain; charset=utf-8", f"{line}\n".encode()

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                accept = self.headers.get("Accept", "")
                status, content_type, body = server.answer(self.path, accept)
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                # Probes every few seconds: access lines only when debugging.
                log.debug("%s %s", self.address_string(), format % args)

        return Handler
