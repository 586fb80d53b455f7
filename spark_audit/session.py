"""Building the SparkSession for the audit (the only place that configures Spark).

The master is never hard-coded: it comes from ``--master``, else from ``spark-submit`` /
``SPARK_MASTER`` / ``spark-defaults.conf`` as Spark normally resolves it, else ``local[*]``
when the job is started as a plain Python process (``pyspark`` does that by default).

The user's configuration wins (:func:`merged_config`): what the application was started
with (``spark-submit --conf``, ``spark-defaults.conf``) and ``--conf`` of ``condmsg
audit`` are kept; the audit adds its Java options to the user's and its jars to theirs,
and sets its other settings only where the user set none. The audit's one requirement,
UTC as the session time zone, is applied while it runs
(:func:`spark_audit.settings.audit_settings`).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field

from pyspark.sql import SparkSession

#: Debian's libpostgresql-jdbc-java. Override with ``--jdbc-jar`` or ``CONDMSG_JDBC_JAR``.
DEFAULT_JDBC_JAR = "/usr/share/java/postgresql.jar"
ENV_JDBC_JAR = "CONDMSG_JDBC_JAR"
#: Let HotSpot compile methods over 8000 bytes of bytecode (see :func:`session_config`).
HUGE_METHODS = "-XX:-DontCompileHugeMethods"
#: Generated classes Spark keeps compiled (its default is 100; see :func:`session_config`).
CODEGEN_CACHE_ENTRIES = 1000


@dataclass(frozen=True, slots=True, kw_only=True)
class SessionOptions:
    """What the audit needs from Spark; everything else comes from the environment."""

    app_name: str = "condmsg-audit"
    master: str | None = None
    jdbc_jar: str | None = None
    shuffle_partitions: int | None = None
    driver_memory: str | None = None
    #: No console progress bar, and Spark's log at ERROR once the session runs.
    quiet: bool = False
    #: The user's settings (``--conf KEY=VALUE``): they win over the audit's.
    extra: Mapping[str, str] = field(default_factory=dict)

    def jar(self) -> str | None:
        jar = self.jdbc_jar or os.environ.get(ENV_JDBC_JAR) or DEFAULT_JDBC_JAR
        return jar if os.path.exists(jar) else None


def session_config(
    options: SessionOptions, launched: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The Spark configuration for ``options`` (a plain dict, so it can be tested): the
    audit's settings under what the application was ``launched`` with
    (:func:`launch_config`), both under the settings ``options`` asks for explicitly
    (``--conf``, ``--driver-memory``, ``--quiet``), see :func:`merged_config`."""
    conf: dict[str, str] = {
        # Every timestamp in the store is a UTC instant; render and bucket them as UTC.
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        # UTC-adjusted INT64 micros, like the exporter's files: pyarrow and other readers
        # see timezone-aware instants (Spark's INT96 default reads back naive).
        "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
        # HotSpot does not JIT-compile a method over 8000 bytes of bytecode by default, and
        # Spark's whole-stage code for the audit's wide rows (the joined facts, the compiled
        # verdicts) is far larger: it would run in the bytecode interpreter. Takes effect
        # where this session starts the JVM (local mode); with spark-submit pass it as
        # --driver-java-options / spark.executor.extraJavaOptions.
        "spark.driver.extraJavaOptions": HUGE_METHODS,
        "spark.executor.extraJavaOptions": HUGE_METHODS,
        # An audit generates more classes (whole-stage code, the compiled verdicts) than
        # Spark's default cache of 100 holds, so a second audit in the same JVM would
        # compile most of them again with Janino, a large part of a warm audit's time.
        # Static: it takes effect where this session starts the JVM.
        "spark.sql.codegen.cache.maxEntries": str(CODEGEN_CACHE_ENTRIES),
        # PySpark's DataFrame debugging records the Python call site in the JVM around
        # every DataFrame and Column call: several Py4J round trips each (the active
        # session, the origin class, a config read, set and clear). Off, an audit makes
        # far fewer Py4J calls. Spark's error messages then name
        # the failing expression but not the Python line that built it.
        "spark.python.sql.dataFrameDebugging.enabled": "false",
    }
    jar = options.jar()
    if jar is not None:
        # spark.jars ships the driver to executors; the driver's own class path needs it too
        # because the JDBC DriverManager is consulted on the driver when planning the read.
        conf["spark.jars"] = jar
        conf["spark.driver.extraClassPath"] = jar
    # What the launch set of the audit's settings (the rest is in effect anyway).
    conf = merged_config(conf, {k: v for k, v in (launched or {}).items() if k in conf})
    explicit: dict[str, str] = {}
    if options.shuffle_partitions is not None:
        explicit["spark.sql.shuffle.partitions"] = str(options.shuffle_partitions)
    if options.driver_memory is not None:
        explicit["spark.driver.memory"] = options.driver_memory
    if options.quiet:
        # pyspark's own launcher turns the progress bar on for a plain Python process.
        explicit["spark.ui.showConsoleProgress"] = "false"
    return merged_config(conf, {**explicit, **options.extra})


#: Settings whose values are lists: the audit's entries are added to the user's.
_LISTS = {
    "spark.driver.extraJavaOptions": " ",
    "spark.executor.extraJavaOptions": " ",
    "spark.jars": ",",
    "spark.driver.extraClassPath": os.pathsep,
}


def merged_config(ours: Mapping[str, str], users: Mapping[str, str]) -> dict[str, str]:
    """The audit's settings ``ours`` under the user's ``users``: a user's value wins, but
    for the list-valued settings (Java options, jars, class path) where the audit's
    entries are added to the user's (those the user's value lacks)."""
    merged = {**ours, **users}
    for key, separator in _LISTS.items():
        if key in ours and key in users:
            theirs = users[key].split(separator)
            extra = [e for e in ours[key].split(separator) if e and e not in theirs]
            merged[key] = separator.join([users[key], *extra]) if extra else users[key]
    return merged


def launch_config() -> dict[str, str]:
    """The configuration the application was started with. Under ``spark-submit`` (or in a
    process whose JVM runs already) the running JVM's: ``--conf`` and
    ``spark-defaults.conf``, which the launcher handed to it as system properties. In a
    plain Python process, where the session starts the JVM itself, ``spark-defaults.conf``
    as the launcher will read it: the JVM must not start before the session's settings are
    known (its class path, for one, is fixed at start)."""
    from pyspark import SparkConf, SparkContext

    if SparkContext._gateway is not None or "PYSPARK_GATEWAY_PORT" in os.environ:
        SparkContext._ensure_initialized()  # connects to the running JVM's gateway
        return dict(SparkConf().getAll())
    return _defaults_file()


def _defaults_file() -> dict[str, str]:
    from pyspark.find_spark_home import _find_spark_home

    directory = os.environ.get("SPARK_CONF_DIR") or os.path.join(_find_spark_home(), "conf")
    path = os.path.join(directory, "spark-defaults.conf")
    if not os.path.isfile(path):
        return {}
    found: dict[str, str] = {}
    with open(path, encoding="utf-8") as lines:
        for line in lines:
            text = line.strip()
            if text and not text.startswith("#"):
                key, _, value = text.replace("=", " ", 1).partition(" ")
                found[key.strip()] = value.strip()
    return found


def build_session(options: SessionOptions | None = None) -> SparkSession:
    """Get or create the session. Pass ``master`` only to override the environment's."""
    options = options or SessionOptions()
    # Python workers must run the interpreter that has pyarrow and condmsg installed; a
    # bare ``python3`` on the PATH often does not. spark-submit users set their own.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = SparkSession.builder.appName(options.app_name)
    if options.master:
        builder = builder.master(options.master)
    for key, value in session_config(options, launch_config()).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    if options.quiet:
        spark.sparkContext.setLogLevel("ERROR")
    return spark
