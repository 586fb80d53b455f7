"""The audit's Spark configuration under the user's: a user's value wins, Java options
and jars are merged, ``--conf`` passes through (no SparkSession needed)."""

from __future__ import annotations

import pytest

from spark_audit.cli import add_arguments
from spark_audit.session import HUGE_METHODS, SessionOptions, merged_config, session_config

JAVA = "spark.executor.extraJavaOptions"


def test_the_users_java_options_keep_theirs_and_gain_the_audits() -> None:
    launched = {JAVA: "-Dapp=1 -XX:+UseG1GC", "spark.sql.session.timeZone": "Europe/Paris"}
    conf = session_config(SessionOptions(jdbc_jar="/nonexistent.jar"), launched)
    assert conf[JAVA] == f"-Dapp=1 -XX:+UseG1GC {HUGE_METHODS}"
    assert conf["spark.driver.extraJavaOptions"] == HUGE_METHODS
    # The user's value stands; the audit sets UTC for its own run (audit_settings).
    assert conf["spark.sql.session.timeZone"] == "Europe/Paris"


def test_explicit_settings_win_over_the_launch_and_lists_are_not_repeated() -> None:
    options = SessionOptions(
        quiet=True, extra={"spark.sql.codegen.cache.maxEntries": "7", JAVA: HUGE_METHODS}
    )
    conf = session_config(options, {"spark.ui.showConsoleProgress": "true"})
    assert conf["spark.ui.showConsoleProgress"] == "false"
    assert conf["spark.sql.codegen.cache.maxEntries"] == "7"
    assert conf[JAVA] == HUGE_METHODS
    assert merged_config({"spark.jars": "a.jar"}, {"spark.jars": "b.jar,a.jar"}) == {
        "spark.jars": "b.jar,a.jar"
    }


def test_conf_passes_through_the_command_line() -> None:
    import argparse

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(
        ["--parquet", "x", "--out", "y", "--conf", "spark.a=1=2", "--conf", "spark.b="]
    )
    assert dict(args.conf) == {"spark.a": "1=2", "spark.b": ""}
    assert args.fetchsize == 10_000
    with pytest.raises(SystemExit):
        parser.parse_args(["--parquet", "x", "--out", "y", "--conf", "novalue"])
