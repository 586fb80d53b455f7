"""Logging of the services (levels and formats from options or the environment, the
banner, repeated failures logged once per change) and the operations endpoint's answers."""

from __future__ import annotations

import io
import json
import logging
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry, Counter

from condmsg import __version__
from condmsg.core.errors import ConfigError
from condmsg.infra.repeated_failures import RepeatedFailures
from condmsg.runtime.logging_setup import JsonFormatter, configure_logging, log_banner
from condmsg.runtime.ops_server import OpsServer, add_process_metrics


@pytest.fixture
def restore_logging() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    levels = {name: logging.getLogger(name).level for name in ("apscheduler", "pika")}
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
    for name, old in levels.items():
        logging.getLogger(name).setLevel(old)


def _record(message: str, *args: object, exc: BaseException | None = None) -> logging.LogRecord:
    exc_info = (type(exc), exc, exc.__traceback__) if exc is not None else None
    return logging.LogRecord("condmsg.test", logging.ERROR, __file__, 1, message, args, exc_info)


def test_json_lines_carry_time_level_logger_message_and_exception() -> None:
    try:
        raise RuntimeError("boom")
    except RuntimeError as exc:
        line = JsonFormatter().format(_record("sweep %s failed", "one", exc=exc))
    assert "\n" not in line
    document = json.loads(line)
    assert document["level"] == "ERROR"
    assert document["logger"] == "condmsg.test"
    assert document["message"] == "sweep one failed"
    assert document["time"].endswith("+00:00")
    assert "RuntimeError: boom" in document["exception"]
    assert "exception" not in json.loads(JsonFormatter().format(_record("fine")))


def test_level_and_format_come_from_the_environment_unless_given(restore_logging: None) -> None:
    stream = io.StringIO()
    env = {"CONDMSG_LOG_LEVEL": "warning", "CONDMSG_LOG_FORMAT": "json"}
    assert configure_logging(environ=env, stream=stream) == logging.WARNING
    logging.getLogger("condmsg.test").info("hidden")
    logging.getLogger("condmsg.test").warning("shown")
    lines = stream.getvalue().splitlines()
    assert [json.loads(line)["message"] for line in lines] == ["shown"]

    stream = io.StringIO()
    assert configure_logging("DEBUG", "text", environ=env, stream=stream) == logging.DEBUG
    logging.getLogger("condmsg.test").debug("plain")
    assert stream.getvalue().rstrip().endswith("DEBUG condmsg.test: plain")
    # Configuring again replaced the first handler instead of adding a second one.
    assert "shown" not in stream.getvalue()


def test_apscheduler_chatter_stays_below_info_unless_debugging(restore_logging: None) -> None:
    configure_logging("INFO", "text", environ={}, stream=io.StringIO())
    assert logging.getLogger("apscheduler").level == logging.WARNING
    # pika's own ERROR lines (with tracebacks) precede every error the services report.
    assert logging.getLogger("pika").level == logging.CRITICAL
    configure_logging("DEBUG", "text", environ={}, stream=io.StringIO())
    assert logging.getLogger("apscheduler").level == logging.DEBUG
    assert logging.getLogger("pika").level == logging.DEBUG


def test_bad_level_or_format_names_the_setting(restore_logging: None) -> None:
    with pytest.raises(ConfigError, match="CONDMSG_LOG_LEVEL"):
        configure_logging(environ={"CONDMSG_LOG_LEVEL": "loud"}, stream=io.StringIO())
    with pytest.raises(ConfigError, match="--log-level"):
        configure_logging("loud", environ={}, stream=io.StringIO())
    with pytest.raises(ConfigError, match="CONDMSG_LOG_FORMAT"):
        configure_logging(environ={"CONDMSG_LOG_FORMAT": "xml"}, stream=io.StringIO())


def test_banner_is_one_line_and_its_fields_are_json_keys(restore_logging: None) -> None:
    stream = io.StringIO()
    configure_logging("INFO", "json", environ={}, stream=stream)
    fields = {"sender": "orders", "store": "postgresql://u:***@db/x", "metrics_port": 9108}
    log_banner(logging.getLogger("condmsg.test"), "evaluator", fields)
    (line,) = stream.getvalue().splitlines()
    document = json.loads(line)
    assert document["message"] == (
        f"condmsg {__version__} evaluator starting: sender=orders, "
        "store=postgresql://u:***@db/x, metrics_port=9108"
    )
    assert document["service"] == "evaluator"
    assert document["version"] == __version__
    assert document["metrics_port"] == 9108


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_repeated_failures_log_once_per_change_and_count_every_one(
    caplog: pytest.LogCaptureFixture,
) -> None:
    registry = CollectorRegistry()
    counter = Counter("failures_total", "failures", registry=registry)
    clock = _Clock()
    log = logging.getLogger("condmsg.test.repeated")
    failures = RepeatedFailures(log, "sweep", on_failure=counter.inc, remind_s=60, clock=clock)
    caplog.set_level(logging.INFO, logger="condmsg.test.repeated")
    for _ in range(30):
        clock.now += 1
        failures.failed(RuntimeError("no such column\nSQL: SELECT ..."))
    assert [r.getMessage() for r in caplog.records] == [
        "sweep failed: RuntimeError: no such column; retrying quietly until it changes"
    ]
    assert caplog.records[0].exc_info is not None  # one traceback, the first time
    assert failures.failing == "RuntimeError: no such column"

    clock.now += 31  # a minute after the first line: one reminder, without a traceback
    failures.failed(RuntimeError("no such column"))
    failures.failed(RuntimeError("no such table"))  # another failure: logged at once
    clock.now += 10
    failures.succeeded()
    failures.succeeded()
    messages = [r.getMessage() for r in caplog.records]
    assert messages[1:] == [
        "sweep still failing (30 times since the last line): RuntimeError: no such column",
        "sweep failed: RuntimeError: no such table; retrying quietly until it changes",
        "sweep works again after 32 failed tries in 70 s",
    ]
    assert caplog.records[1].exc_info is None
    assert registry.get_sample_value("failures_total") == 32
    assert failures.failing is None


def _get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def test_ops_server_serves_metrics_and_checks_and_stops() -> None:
    registry = CollectorRegistry()
    add_process_metrics(registry)
    ready: list[str | None] = ["waiting for the database at postgresql://db\nsecond line"]
    server = OpsServer(
        registry, port=0, host="127.0.0.1", live=lambda: None, ready=lambda: ready[0]
    )
    with server:
        port = server.port
        status, body = _get(port, "/metrics")
        assert status == 200
        assert "process_cpu_seconds_total" in body
        assert 'condmsg_build_info{python="' in body and f'version="{__version__}"' in body
        assert _get(port, "/healthz") == (200, "ok\n")
        assert _get(port, "/readyz") == (
            503,
            "waiting for the database at postgresql://db second line\n",
        )
        ready[0] = None
        assert _get(port, "/readyz") == (200, "ok\n")
        assert _get(port, "/nothing")[0] == 404
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2)


def test_ops_server_on_a_taken_port_says_which() -> None:
    def ok() -> None:
        return None

    server = OpsServer(CollectorRegistry(), port=0, live=ok, ready=ok)
    try:
        with pytest.raises(ConfigError, match=f"port {server.port}"):
            OpsServer(CollectorRegistry(), port=server.port, live=ok, ready=ok)
    finally:
        server.stop()
