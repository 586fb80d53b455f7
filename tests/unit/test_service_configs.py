"""The configuration objects of the evaluator and the outbox relay: what they read from
the environment, what they refuse, what they never print."""

from __future__ import annotations

import dataclasses
from datetime import timedelta
from pathlib import Path

import pytest

from condmsg.core.errors import ConfigError
from condmsg.runtime.settings import Settings
from evaluator.config import EvaluatorConfig
from outbox import RelayConfig

AMQP = "amqp://user:pw@broker:5672/%2F"
PG = "postgresql+psycopg://user:pw@db/condmsg"
KEY = "a7f3c91e0b5d28e4f6a1c3b9d7e05f28"


def test_the_evaluator_config_reads_the_condmsg_settings(tmp_path: Path) -> None:
    env = {
        "CONDMSG_AMQP_URL": AMQP,
        "CONDMSG_DB_URL": PG,
        "CONDMSG_SECRET": KEY,
        "CONDMSG_ACK_GRACE_MS": "300",
        "CONDMSG_CLOCK_SKEW_MS": "2000",
        "CONDMSG_RETENTION": "7d",
        "CONDMSG_ARCHIVE_DIR": str(tmp_path),
        "CONDMSG_RETENTION_INTERVAL_S": "60",
    }
    config = EvaluatorConfig.from_env(env, sender="orders")
    assert (config.amqp_url, config.db_url, config.secret) == (AMQP, PG, KEY.encode())
    assert config.ack_grace == timedelta(milliseconds=300)
    assert config.clock_skew == timedelta(seconds=2)
    assert config.retention_policy is not None
    assert config.retention_policy.older_than == timedelta(days=7)
    assert config.retention_policy.archive == tmp_path
    assert config.retention_interval_s == 60
    # The fields given take precedence; the defaults are those of the settings.
    given = EvaluatorConfig.from_env(env, sender="orders", ack_grace=timedelta(0), batch_size=8)
    assert (given.ack_grace, given.batch_size) == (timedelta(0), 8)
    plain = EvaluatorConfig.from_env({}, sender="orders")
    defaults = Settings()
    assert (plain.amqp_url, plain.db_url) == (defaults.amqp_url, defaults.db_url)
    assert plain.retention_policy is None


def test_the_evaluator_config_refuses_what_cannot_run(tmp_path: Path) -> None:
    base = EvaluatorConfig(amqp_url=AMQP, sender="s", db_url=PG)
    bad = [
        ({"retention": timedelta(days=1)}, "archive directory"),
        (
            {"retention": timedelta(days=1), "retention_archive": tmp_path, "retention_batch": 0},
            "retention batch",
        ),
        (
            {"retention": timedelta(0), "retention_archive": tmp_path},
            "retention period must be positive",
        ),
        (
            {
                "retention": timedelta(days=1),
                "retention_archive": tmp_path,
                "retention_interval_s": 0,
            },
            "interval must be positive",
        ),
        ({"clock_skew": timedelta(milliseconds=-1)}, "clock-skew"),
        ({"store_threads": 0}, "store_threads"),
        ({"intake_processes": 2, "db_url": "sqlite:///x.db"}, "PostgreSQL"),
        ({"intake_processes": 2, "db_url": None}, "need db_url"),
    ]
    for changes, message in bad:
        with pytest.raises(ConfigError, match=message):
            dataclasses.replace(base, **changes)
    assert dataclasses.replace(base, intake_processes=2).intake_processes == 2


def test_configs_never_print_urls_or_the_secret() -> None:
    shown = repr(EvaluatorConfig(amqp_url=AMQP, sender="s", db_url=PG, secret=KEY.encode()))
    shown += repr(RelayConfig(amqp_url=AMQP))
    assert "pw" not in shown and KEY not in shown


@pytest.mark.parametrize("secret", [b"change-me", b"hush", b"k" * 40])
def test_the_evaluator_config_refuses_a_weak_secret(secret: bytes) -> None:
    with pytest.raises(ConfigError, match=r"the evaluator's secret .*condmsg secret new"):
        EvaluatorConfig(amqp_url=AMQP, sender="s", db_url=PG, secret=secret)


def test_the_relay_config_reads_the_broker_url() -> None:
    assert RelayConfig.from_env({"CONDMSG_AMQP_URL": AMQP}).amqp_url == AMQP
    # The outbox imports nothing of condmsg: its default must still be the same broker.
    assert RelayConfig.from_env({}).amqp_url == Settings().amqp_url
    given = RelayConfig.from_env({}, batch_size=7, table_name="t_outbox")
    assert (given.batch_size, given.table_name) == (7, "t_outbox")
    for field in ("batch_size", "max_batches_in_flight"):
        with pytest.raises(ValueError, match="at least 1"):
            RelayConfig(amqp_url=AMQP, **{field: 0})


def test_settings_mask_a_password_in_a_urls_query_string() -> None:
    settings = Settings(db_url="postgresql+psycopg://u@db/x?sslpassword=hush&password=hush")
    shown = repr(settings)
    assert "hush" not in shown and "sslpassword=***&password=***" in shown
