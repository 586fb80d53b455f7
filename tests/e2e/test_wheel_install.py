"""The distribution as a user gets it: the sdist and the wheel build and pass ``twine
check``, and the wheel installed into a fresh virtualenv without the ``audit`` extra
(dependencies from the package index) upgrades a store, sends and relays a conditional
message against the real PostgreSQL and RabbitMQ, without PySpark, pyarrow or pandas.

Building and installing take a while, so the module's tests share one build and one
virtualenv, on one xdist worker.
"""

from __future__ import annotations

import email.parser
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pika
import pytest

from condmsg import __version__
from condmsg.cli.extras import AUDIT_INSTALL
from tests.e2e.conftest import ROOT
from tests.waiting import wait_for

pytestmark = [
    pytest.mark.rabbitmq,
    pytest.mark.postgres,
    pytest.mark.slow,
    pytest.mark.xdist_group("wheel"),  # one build and one virtualenv for the module
    pytest.mark.timeout(900),  # the install downloads its dependencies from the index
]

#: What a build reads: the packages and the files pyproject.toml and MANIFEST.in name.
SOURCES = ("pyproject.toml", "README.md", "LICENSE", "CHANGELOG.md", "MANIFEST.in")
PACKAGES = ("condmsg", "ackd", "evaluator", "outbox", "spark_audit")
#: The modules of the audit extra.
EXTRA = ("pyspark", "pyarrow", "pandas")
#: The install without the extra stays far below PySpark's own size (about 490 MB): a
#: heavy dependency that creeps back in fails here.
MAX_INSTALL_MB = 150

Run = Callable[..., "subprocess.CompletedProcess[str]"]


@dataclass(frozen=True)
class Dists:
    wheel: Path
    sdist: Path


@pytest.fixture(scope="module")
def dists(tmp_path_factory: pytest.TempPathFactory) -> Dists:
    """The sdist and the wheel, built from a copy of the sources (the build writes its
    metadata beside the sources it reads, which must not be the shared checkout)."""
    work = tmp_path_factory.mktemp("build")
    source = work / "src"
    source.mkdir()
    for name in SOURCES:
        shutil.copy2(ROOT / name, source / name)
    for package in PACKAGES:
        shutil.copytree(
            ROOT / package, source / package, ignore=shutil.ignore_patterns("__pycache__")
        )
    out = work / "dist"
    built = subprocess.run(
        [sys.executable, "-m", "build", "--outdir", str(out), str(source)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    (wheel,) = out.glob("condmsg-*.whl")
    (sdist,) = out.glob("condmsg-*.tar.gz")
    return Dists(wheel=wheel, sdist=sdist)


@pytest.fixture(scope="module")
def venv(dists: Dists, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh virtualenv with the wheel installed without extras; returns its bin/."""
    home = tmp_path_factory.mktemp("venv") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(home)], check=True, timeout=300)
    installed = subprocess.run(
        [str(home / "bin" / "python"), "-m", "pip", "install", "--quiet", str(dists.wheel)],
        capture_output=True,
        text=True,
        timeout=900,
        env=_outside_env(),
    )
    assert installed.returncode == 0, installed.stdout[-3000:] + installed.stderr[-3000:]
    return home / "bin"


def _outside_env(**settings: str) -> dict[str, str]:
    """The environment of a user's shell: nothing that points Python at this checkout or
    at the test run's own virtualenv."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return {**env, **settings}


def test_the_dists_pass_twine_check_and_carry_licence_and_changelog(dists: Dists) -> None:
    checked = subprocess.run(
        [sys.executable, "-m", "twine", "check", "--strict", str(dists.wheel), str(dists.sdist)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr

    with zipfile.ZipFile(dists.wheel) as wheel:
        names = wheel.namelist()
        info = f"condmsg-{__version__}.dist-info"
        metadata = email.parser.Parser().parsestr(wheel.read(f"{info}/METADATA").decode())
    assert f"{info}/licenses/LICENSE" in names
    assert metadata["License-Expression"] == "Apache-2.0"
    assert "audit" in metadata.get_all("Provides-Extra", [])
    requires = metadata.get_all("Requires-Dist", [])
    for module in EXTRA:
        (requirement,) = (r for r in requires if r.lower().startswith(module))
        assert 'extra == "audit"' in requirement, requirement

    with tarfile.open(dists.sdist) as sdist:
        shipped = {
            Path(name).relative_to(f"condmsg-{__version__}").as_posix() for name in sdist.getnames()
        }
    assert {"LICENSE", "CHANGELOG.md", "README.md"} <= shipped


def test_the_wheel_without_the_extra_upgrades_sends_and_relays(
    venv: Path, pg_url: str, amqp_url: str, unique_name: str, tmp_path: Path
) -> None:
    env = _outside_env(
        CONDMSG_DB_URL=pg_url,
        CONDMSG_AMQP_URL=amqp_url,
        CONDMSG_SECRET="wheel-test-secret-1a7d3f9c5e8b2046",
    )

    def condmsg(*args: str) -> subprocess.CompletedProcess[str]:
        """``condmsg *args`` from the virtualenv, as a user's shell runs it."""
        return subprocess.run(
            [str(venv / "condmsg"), *args],
            cwd=tmp_path,  # not the checkout, whose packages would shadow the installed ones
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )

    probe = (
        "import importlib.util, condmsg\n"
        f"print([m for m in {EXTRA!r} if importlib.util.find_spec(m)], condmsg.__file__)"
    )
    found = subprocess.run(
        [str(venv / "python"), "-c", probe], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert found.returncode == 0, found.stderr
    absent, installed_at = found.stdout.split()
    assert absent == "[]"
    assert installed_at.startswith(str(venv.parent)), installed_at
    size_mb = _size(venv.parent) / 1e6
    assert size_mb < MAX_INSTALL_MB, f"the install without the extra is {size_mb:.0f} MB"

    version = condmsg("--version")
    assert (version.returncode, version.stdout.strip()) == (0, f"condmsg {__version__}")

    upgraded = condmsg("db", "upgrade", "--store", "sender")
    assert upgraded.returncode == 0, upgraded.stderr
    assert "(current)" in upgraded.stdout

    queue = f"{unique_name}.q"
    payload = tmp_path / "payload.txt"
    payload.write_bytes(b"flight LH400 inbound")
    sent = condmsg(
        "send",
        "--sender",
        unique_name.replace(".", "-"),
        "--condition",
        f"{{type: destination, name: {queue}, pickup_within_ms: 60000}}",
        "--payload",
        str(payload),
    )
    assert sent.returncode == 0, sent.stderr
    cm_id = sent.stdout.strip()
    assert _pending(condmsg) == 1  # the copy waits in the outbox for a relay

    relay = subprocess.Popen(
        [str(venv / "condmsg"), "relay"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for(lambda: _pending(condmsg) == 0, timeout=60)
    finally:
        relay.send_signal(signal.SIGTERM)
        _, log = relay.communicate(timeout=30)
    assert relay.returncode == 0, log

    [(body, headers)] = _drain(amqp_url, queue)
    assert body == b"flight LH400 inbound"
    assert headers["condmsg-cm-id"] == cm_id

    exported = condmsg("export", "--out", str(tmp_path / "export"))
    assert exported.returncode == 2
    (line,) = exported.stderr.splitlines()
    assert line.startswith("condmsg export: ") and line.endswith(AUDIT_INSTALL), line
    assert not (tmp_path / "export").exists()


def _pending(condmsg: Run) -> int:
    """The outbox rows waiting for the relay, as ``condmsg relay --status`` gives them."""
    status = condmsg("relay", "--status")
    assert status.returncode == 0, status.stderr
    (line,) = (x for x in status.stdout.splitlines() if x.startswith("pending:"))
    return int(line.split(":", 1)[1])


def _drain(amqp_url: str, queue: str) -> list[tuple[bytes, dict[str, object]]]:
    """Every message on ``queue`` (body and headers), taken off it."""
    taken = []
    connection = pika.BlockingConnection(pika.URLParameters(amqp_url))
    try:
        channel = connection.channel()
        while True:
            method, properties, body = channel.basic_get(queue, auto_ack=True)
            if method is None:
                return taken
            taken.append((body, dict(properties.headers or {})))
    finally:
        connection.close()


def _size(directory: Path) -> int:
    """Bytes the files under ``directory`` take, as ``du`` counts them."""
    total = 0
    for parent, _dirs, files in os.walk(directory):
        for name in files:
            stat = os.lstat(os.path.join(parent, name))
            total += stat.st_blocks * 512
    return total
