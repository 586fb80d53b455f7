"""Files the audit reads and writes beside its tables, through Hadoop's FileSystem API.

Every location the audit takes is a Hadoop URI (``file://``, ``hdfs://``, ``s3a://``, ...)
or a plain path, which Hadoop resolves against the default filesystem
(``fs.defaultFS``: the local disk unless the cluster's configuration says otherwise).
Spark's readers and writers take the same URIs; this module covers the rest: whether an
export exists, its manifest, ``summary.json`` and ``report.html``. Going through the
JVM's FileSystem means a location works here exactly when it works for Spark (the same
configuration, credentials and connectors, e.g. ``hadoop-aws`` for ``s3a://``).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def child(location: str, *names: str) -> str:
    """``location/name/...``: the URI (or path) of an entry below ``location``."""
    return "/".join([location.rstrip("/"), *names])


def _path(spark: SparkSession, location: str) -> tuple[Any, Any]:
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    path = jvm.org.apache.hadoop.fs.Path(location)
    conf = spark.sparkContext._jsc.hadoopConfiguration()
    return path.getFileSystem(conf), path


def qualified(spark: SparkSession, location: str) -> str:
    """``location`` as the full URI Hadoop resolves it to (a plain relative path becomes
    ``file:/abs/path`` on a local default filesystem): what the summary records."""
    fs, path = _path(spark, location)
    return str(fs.makeQualified(path).toString())


def exists(spark: SparkSession, location: str) -> bool:
    fs, path = _path(spark, location)
    return bool(fs.exists(path))


def read_text(spark: SparkSession, location: str) -> str | None:
    """The file's text (UTF-8), or None where there is no such file."""
    fs, path = _path(spark, location)
    if not fs.exists(path):
        return None
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    stream = fs.open(path)
    try:
        data = jvm.org.apache.commons.io.IOUtils.toByteArray(stream)
    finally:
        stream.close()
    return bytes(data).decode()


def write_text(spark: SparkSession, location: str, text: str) -> None:
    """Write (or replace) the file at ``location``; its parent directories are created."""
    fs, path = _path(spark, location)
    stream = fs.create(path, True)
    try:
        stream.write(bytearray(text.encode()))
    finally:
        stream.close()


def read_json(spark: SparkSession, location: str) -> dict[str, Any] | None:
    text = read_text(spark, location)
    if text is None:
        return None
    data: dict[str, Any] = json.loads(text)
    return data
