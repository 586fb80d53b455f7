"""The three-node RabbitMQ cluster of ``.ci/rabbitmq-cluster``, for failover tests.

The session starts a cluster of its own (its own directory, ports and node names, so that
test runs on one machine never stop each other's nodes) and stops it at the end; with
``CONDMSG_CLUSTER_DIR`` set it uses that cluster instead, starting it if it does not run.
A cluster that cannot be started fails the tests, as a missing service does. Every test of
this directory shares one xdist worker (``xdist_group``), so only one process starts,
stops and restarts nodes. After each test every node runs again and every queue is
deleted.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pika
import pika.exceptions
import pytest

from condmsg.sending.sender import Sender
from tests.running_world import RunningWorld

SCRIPT = Path(__file__).resolve().parents[2] / ".ci" / "rabbitmq-cluster"
NODES = (1, 2, 3)
#: The deployment secret of the cluster tests' senders and evaluators.
SECRET = b"condmsg-cluster-secret-2e8c4a6f9b1d"


def _run(*args: str, env: dict[str, str] | None = None, timeout: float = 180) -> str:
    done = subprocess.run(
        [str(SCRIPT), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        env={**os.environ, **(env or {})},
    )
    if done.returncode != 0:
        raise RuntimeError(f"{SCRIPT.name} {' '.join(args)} failed: {done.stdout}{done.stderr}")
    return done.stdout


@dataclass
class Cluster:
    """The running cluster: its addresses and its nodes (numbered 1-3)."""

    urls: list[str]
    #: CONDMSG_CLUSTER_DIR and CONDMSG_CLUSTER_BASE_PORT of this cluster, for the script.
    env: dict[str, str]

    def run(self, *args: str, timeout: float = 180) -> str:
        """``.ci/rabbitmq-cluster ARGS`` for this cluster."""
        return _run(*args, env=self.env, timeout=timeout)

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
        self.run("stop-node", str(node))

    def start_node(self, node: int) -> None:
        self.run("start-node", str(node))

    def running(self, node: int) -> bool:
        try:
            pika.BlockingConnection(pika.URLParameters(self.node_url(node))).close()
        except pika.exceptions.AMQPError:
            return False
        return True

    def leaders(self) -> Counter[int]:
        """How many quorum queues each node leads."""
        listed = json.loads(
            self.run(
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
            self.run(
                "ctl", str(self._a_running_node()), "list_queues", "name", "--formatter", "json"
            )
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


def _free_base_port() -> int:
    """A base port whose three AMQP ports and distribution ports (+20000) are free."""
    for base in range(5700 + os.getpid() % 50 * 6, 6400, 6):
        ports = [base + i for i in range(3)] + [base + 20000 + i for i in range(3)]
        try:
            for port in ports:
                with socket.socket() as sock:
                    sock.bind(("127.0.0.1", port))
        except OSError:
            continue
        return base
    raise RuntimeError("no free ports for a test cluster between 5700 and 6400")


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    shared = os.environ.get("CONDMSG_CLUSTER_DIR")
    if shared:
        env = {"CONDMSG_CLUSTER_DIR": shared}
    else:
        env = {
            "CONDMSG_CLUSTER_DIR": str(tmp_path_factory.mktemp("rabbitmq-cluster")),
            "CONDMSG_CLUSTER_BASE_PORT": str(_free_base_port()),
        }
    probe = Cluster(_run("urls", env=env).strip().split(","), env)
    started = False
    if not all(probe.running(n) for n in NODES):
        try:
            probe.run("start", timeout=300)
        except (RuntimeError, subprocess.TimeoutExpired) as exc:
            pytest.fail(f"cannot start the test cluster: {exc}", pytrace=False)
        started = True
    try:
        yield probe
    finally:
        if started and not shared:
            probe.run("stop")


@pytest.fixture
def nodes(cluster: Cluster) -> Iterator[Cluster]:
    """The cluster, with every node running again and no queue left after the test."""
    yield cluster
    for node in NODES:
        if not cluster.running(node):
            cluster.start_node(node)
    cluster.delete_all_queues()


@pytest.fixture
def quorum_sender(
    nodes: Cluster, pg_url: str, unique_name: str, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Sender]:
    """A sender on the cluster whose destinations are quorum queues; receivers read that
    queue type from the environment, as deployed."""
    monkeypatch.setenv("CONDMSG_DESTINATION_QUEUE_TYPE", "quorum")
    made = Sender(
        amqp_url=nodes.url,
        db_url=pg_url,
        name=unique_name.replace(".", "-"),
        secret=SECRET,
        create_schema=True,
        destination_queue_type="quorum",
    )
    yield made
    made.engine.dispose()


@pytest.fixture
def sweep_interval_s() -> float:
    """How often the evaluator of ``node_loss_world`` sweeps (a module may set its own)."""
    return 0.1


@pytest.fixture
def node_loss_world(
    quorum_sender: Sender, pg_url: str, unique_name: str, sweep_interval_s: float
) -> Iterator[RunningWorld]:
    """The quorum sender and its evaluator running on the cluster, all nodes up: the world
    a test then loses a node under. The evaluator is stopped afterwards (a test that reads
    the decisions stops it first with ``stop()``)."""
    world = RunningWorld.start(
        quorum_sender, pg_url, unique_name, SECRET, sweep_interval_s=sweep_interval_s
    )
    try:
        yield world
    finally:
        world.stop()
