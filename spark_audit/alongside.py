"""Work run in a second driver thread while the caller's block runs.

The audit overlaps two independent Spark jobs this way: one is planned and submitted
from the second thread, so its planning and the driver's work on the other overlap the
running jobs, and its tasks take the cores the other leaves idle.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor, wait
from contextlib import contextmanager
from typing import TypeVar
from uuid import uuid4

from pyspark.sql import SparkSession
from pyspark.util import inheritable_thread_target

_T = TypeVar("_T")
#: How often :func:`run_alongside` cancels its thread's jobs again while it waits for
#: the thread.
_CANCEL_EVERY_S = 0.2


@contextmanager
def run_alongside(spark: SparkSession, work: Callable[[], _T]) -> Iterator[Future[_T]]:
    """``work`` run in a second driver thread while the block runs (its result: the
    future). The thread inherits the caller's Spark local properties and tags; its jobs
    carry a tag of their own, so that if the block fails they are cancelled rather than
    waited for, including one the thread submits after the failure (Spark cancels only
    the jobs already submitted: the tag is cancelled again until the thread is done)."""
    context = spark.sparkContext
    tag = f"condmsg-audit-{uuid4().hex}"

    def tagged() -> _T:
        context.addJobTag(tag)
        try:
            return work()
        finally:
            context.removeJobTag(tag)

    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="condmsg-audit") as pool:
        future = pool.submit(inheritable_thread_target(spark)(tagged))
        try:
            yield future
        except BaseException:
            while not future.done():
                context.cancelJobsWithTag(tag)
                wait([future], timeout=_CANCEL_EVERY_S)
            raise
