"""Files the audit reads and writes beside its tables, through Hadoop's FileSystem API.

Every location the audit takes is a Hadoop URI (``file://``, ``hdfs://``, ``s3a://``, ...)
or a plain path, which Hadoop resolves against the default filesystem
(``fs.defaultFS``: the local disk unless the cluster's configuration says otherwise).
Spark's readers and writers take the same URIs; this module covers the rest: whether an
export exists, its manifest, ``summary.json``, ``report.html`` and the small tables built
on the driver (:func:`write_parquet`). Going through the JVM's FileSystem means a
location works here exactly when it works for Spark (the same configuration, credentials
and connectors, e.g. ``hadoop-aws`` for ``s3a://``).
"""

from __future__ import annotations

import io
import json
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.parquet as pq

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

#: The one data file of a table :func:`write_parquet` writes, and the marker Spark's
#: writers leave in a complete output directory.
PART_FILE = "part-00000.snappy.parquet"
SUCCESS_FILE = "_SUCCESS"
#: Bytes handed to the JVM per call (each call is one Py4J message).
_CHUNK = 4 << 20


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
    write_bytes(spark, location, text.encode())


def write_bytes(spark: SparkSession, location: str, data: bytes) -> None:
    """Write (or replace) the file at ``location`` with ``data``."""
    fs, path = _path(spark, location)
    stream = fs.create(path, True)
    try:
        for start in range(0, len(data), _CHUNK):
            stream.write(bytearray(data[start : start + _CHUNK]))
    finally:
        stream.close()


def write_parquet(spark: SparkSession, location: str, table: pa.Table) -> None:
    """Replace the directory ``location`` with ``table`` as one Snappy-compressed Parquet
    file and a ``_SUCCESS`` marker: the layout Spark's writer leaves for one partition,
    read back by ``spark.read.parquet`` and by pyarrow alike. For tables already on the
    driver: it writes through the FileSystem API, with no Spark job."""
    buffer = io.BytesIO()
    pq.write_table(table, buffer, compression="snappy", store_schema=False)
    fs, path = _path(spark, location)
    fs.delete(path, True)
    write_bytes(spark, child(location, PART_FILE), buffer.getvalue())
    write_bytes(spark, child(location, SUCCESS_FILE), b"")


def read_json(spark: SparkSession, location: str) -> dict[str, Any] | None:
    text = read_text(spark, location)
    if text is None:
        return None
    data: dict[str, Any] = json.loads(text)
    return data
