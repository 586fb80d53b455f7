"""The three-node RabbitMQ cluster of ``.ci/rabbitmq-cluster``, for failover tests.

The session starts the cluster unless it runs already (and then stops it again at the
end); a cluster that cannot be started fails the tests, as a missing service does. Every
test of this directory shares one xdist worker (``xdist_group``), so only one process
starts, stops and restarts nodes. After each test every node runs again and every queue
is deleted.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pika
import pika.exceptions
import pytest

SCRIPT = Path(__file__).resolve().parents[2] / ".ci" / "rabbitmq-cluster"
NODES = (1, 2, 3)


def _run(*args: str, timeout: float = 180) -> str:
    done = subprocess.run(
        [str(SCRIPT), *args], capture_output=True, text=True, timeout=timeout, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"{SCRIPT.name} {' '.join(args)} failed: {done.stdout}{done.stderr}")
    return done.stdout


@dataclass
class Cluster:
    """The running cluster: its addresses and its nodes (numbered 1-3)."""

    urls: list[str]

    @property
    def url(self) -> str:
        """The comma-separated CONDMSG_AMQP_URL of all three nodes."""
        return ",".join(self.urls)

    def node_url(self, node: int) -> str:
        return self.urls[node - 1]

    def port(self, node: int) -> int:
        return int(self.urls[node - 1].rsplit(":", 1)[1].split("/")[0])

    def node_of_port(self, port: int) -> int:
        return next(n for n in NODES if self.port(n) == port)

    def stop_node(self, node: int) -> None:
        """Stop RabbitMQ on ``node``: its clients' connections end, its queue replicas stop."""
        _run("stop-node", str(node))

    def start_node(self, node: int) -> None:
        _run("start-node", str(node))

    def running(self, node: int) -> bool:
        try:
            pika.BlockingConnection(pika.URLParameters(self.node_url(node))).close()
        except pika.exceptions.AMQPError:
            return False
        return True

    def leaders(self) -> Counter[int]:
        """How many quorum queues each node leads."""
        listed = json.loads(
            _run(
                "ctl",
                str(self._a_running_node()),
                "list_queues",
                "name",
                "leader",
                "--formatter",
                "json",
            )
        )
        counts: Counter[int] = Counter()
        for queue in listed:
            leader = str(queue.get("leader") or "")
            if leader.startswith("rabbit-c"):
                counts[int(leader[len("rabbit-c")].strip())] += 1
        return counts

    def _a_running_node(self) -> int:
        return next(n for n in NODES if self.running(n))

    def delete_all_queues(self) -> None:
        listed = json.loads(
            _run("ctl", str(self._a_running_node()), "list_queues", "name", "--formatter", "json")
        )
        connection = pika.BlockingConnection(
            [pika.URLParameters(u) for u in self.urls]  # the first that answers
        )
        try:
            for queue in listed:
                channel = connection.channel()
                channel.queue_delete(queue["name"])
                channel.close()
        finally:
            connection.close()


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    started = False
    urls = _run("urls").strip().split(",")
    probe = Cluster(urls)
    if not all(probe.running(n) for n in NODES):
        try:
            _run("stop")  # leftovers of an interrupted run
            _run("start", timeout=300)
        except (RuntimeError, subprocess.TimeoutExpired) as exc:
            pytest.fail(f"cannot start the test cluster: {exc}", pytrace=False)
        started = True
    try:
        yield probe
    finally:
        if started:
            _run("stop")


@pytest.fixture
def nodes(cluster: Cluster) -> Iterator[Cluster]:
    """The cluster, with every node running again and no queue left after the test."""
    yield cluster
    for node in NODES:
        if not cluster.running(node):
            cluster.start_node(node)
    cluster.delete_all_queues()


def wait_until(predicate: object, timeout: float, what: str, interval: float = 0.05) -> None:
    """Poll ``predicate`` until it is true; fail naming ``what`` after ``timeout`` seconds."""
    assert callable(predicate)
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:g} s waiting for {what}", pytrace=False)
        time.sleep(interval)
