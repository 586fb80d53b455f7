"""The deployment files: compose.yaml as docker compose resolves it (on a fresh clone, and
with a .env made from .env.example), and the Dockerfile and .dockerignore read statically,
since no Docker engine runs here to build the image.

The validator is ``docker compose`` where the plugin is installed, else ``docker-compose``
(Debian's, which ``make test`` installs). Neither needs an engine for ``config``."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tomllib
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
SERVICES = {"rabbitmq", "postgres", "migrate", "relay", "evaluator"}
CONDMSG_SERVICES = ("migrate", "relay", "evaluator")
LONG_RUNNING = ("relay", "evaluator")
#: The port the relay and the evaluator serve /readyz on in their containers.
OPS_PORT = "9464"


@cache
def _compose_command() -> tuple[str, ...]:
    docker = shutil.which("docker")
    if docker:
        plugin = subprocess.run([docker, "compose", "version"], capture_output=True, timeout=30)
        if plugin.returncode == 0:
            return (docker, "compose")
    legacy = shutil.which("docker-compose")
    if legacy:
        return (legacy,)
    pytest.fail(
        "no compose validator: install Debian's docker-compose "
        "(apt-get install docker-compose; `make test` does) or the docker compose plugin"
    )


def _project(tmp_path: Path, *, env_file: bool) -> Path:
    """A fresh clone's deployment files in ``tmp_path``; with ``env_file``, the operator's
    first step, ``cp .env.example .env``."""
    for name in ("compose.yaml", "Dockerfile", ".dockerignore", ".env.example"):
        shutil.copy(ROOT / name, tmp_path / name)
    if env_file:
        shutil.copy(ROOT / ".env.example", tmp_path / ".env")
    return tmp_path


def _config(project: Path, **environ: str) -> dict[str, Any]:
    """``compose -f compose.yaml config`` in ``project``, parsed; the shell's environment is
    only PATH and HOME (and ``environ``), so no CONDMSG_* of the test run leaks in."""
    env = {"PATH": os.environ["PATH"], "HOME": str(project), **environ}
    done = subprocess.run(
        [*_compose_command(), "-f", "compose.yaml", "config"],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, f"compose config failed:\n{done.stderr}"
    resolved = yaml.safe_load(done.stdout)
    assert isinstance(resolved, dict)
    return resolved


def _source() -> dict[str, Any]:
    loaded = yaml.safe_load((ROOT / "compose.yaml").read_text())
    assert isinstance(loaded, dict)
    return loaded


def _dotenv(path: Path) -> dict[str, str]:
    pairs = {}
    for line in path.read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            key, _, value = line.partition("=")
            pairs[key.strip()] = value.strip()
    return pairs


def _mounts(service: dict[str, Any]) -> dict[str, str]:
    """target -> source of a resolved service's volumes (short or long syntax)."""
    found = {}
    for volume in service.get("volumes", []):
        if isinstance(volume, str):
            source, target = volume.split(":")[:2]
        else:
            source, target = volume["source"], volume["target"]
        found[target] = source
    return found


# -- compose.yaml ---------------------------------------------------------------------------


def test_compose_validates_on_a_fresh_clone_with_development_defaults(tmp_path: Path) -> None:
    services = _config(_project(tmp_path, env_file=False))["services"]
    assert set(services) == SERVICES
    for name in CONDMSG_SERVICES:
        env = services[name]["environment"]
        assert env["CONDMSG_DB_URL"] == "postgresql+psycopg://postgres@postgres:5432/test"
        assert env["CONDMSG_AMQP_URL"] == "amqp://guest:guest@rabbitmq:5672/%2F"
    # No secret given: the evaluator leaves it to the sender store (an empty value is unset).
    assert services["evaluator"]["environment"]["CONDMSG_SECRET"] in ("", None)
    assert services["postgres"]["environment"]["POSTGRES_HOST_AUTH_METHOD"] == "trust"
    assert services["postgres"]["environment"]["POSTGRES_DB"] == "test"


def test_compose_takes_secret_and_credentials_from_the_env_file(tmp_path: Path) -> None:
    dotenv = _dotenv(ROOT / ".env.example")
    services = _config(_project(tmp_path, env_file=True))["services"]
    evaluator = services["evaluator"]
    assert evaluator["environment"]["CONDMSG_SECRET"] == dotenv["CONDMSG_SECRET"]
    assert evaluator["command"][evaluator["command"].index("--sender") + 1] == "app"
    for name in CONDMSG_SERVICES:
        env = services[name]["environment"]
        assert env["CONDMSG_DB_URL"] == dotenv["CONDMSG_DB_URL"]
        assert env["CONDMSG_AMQP_URL"] == dotenv["CONDMSG_AMQP_URL"]
    # Only the evaluator signs (compensations, notices); the relay publishes signed rows.
    for name in ("migrate", "relay"):
        assert "CONDMSG_SECRET" not in services[name]["environment"], name
    postgres = services["postgres"]["environment"]
    assert postgres["POSTGRES_PASSWORD"] == dotenv["POSTGRES_PASSWORD"]
    assert postgres["POSTGRES_HOST_AUTH_METHOD"] == "scram-sha-256"
    credentials = f"{dotenv['POSTGRES_USER']}:{dotenv['POSTGRES_PASSWORD']}@postgres:5432/"
    assert credentials in dotenv["CONDMSG_DB_URL"]
    rabbitmq = services["rabbitmq"]["environment"]
    assert rabbitmq["RABBITMQ_DEFAULT_PASS"] == dotenv["RABBITMQ_DEFAULT_PASS"]


def test_every_service_is_health_checked_and_the_services_wait_for_the_schema(
    tmp_path: Path,
) -> None:
    services = _config(_project(tmp_path, env_file=False))["services"]
    for name in SERVICES - {"migrate"}:
        assert services[name]["healthcheck"]["test"], name
    assert "rabbitmq-diagnostics" in services["rabbitmq"]["healthcheck"]["test"]
    assert "pg_isready" in " ".join(services["postgres"]["healthcheck"]["test"])

    migrate = services["migrate"]
    assert migrate["command"] == ["db", "upgrade", "--store", "sender"]
    assert migrate["restart"] == "no"
    assert migrate["depends_on"]["postgres"]["condition"] == "service_healthy"
    for name in LONG_RUNNING:
        service = services[name]
        depends = service["depends_on"]
        assert depends["migrate"]["condition"] == "service_completed_successfully", name
        assert depends["rabbitmq"]["condition"] == "service_healthy", name
        # The healthcheck asks /readyz on the port the service's command serves it on.
        command = service["command"]
        assert command[command.index("--metrics-port") + 1] == OPS_PORT, name
        test = service["healthcheck"]["test"]
        assert test[:3] == ["CMD", "python", "-c"], name
        assert f"http://127.0.0.1:{OPS_PORT}/readyz" in test[3], name
        assert service["restart"] == "unless-stopped", name
    # One relay per store: the evaluator leaves publishing to the relay service.
    assert "--no-relay" in services["evaluator"]["command"]


def test_state_lives_in_named_volumes(tmp_path: Path) -> None:
    resolved = _config(_project(tmp_path, env_file=False))
    services = resolved["services"]
    declared = set(resolved["volumes"])
    expected = {
        ("rabbitmq", "/var/lib/rabbitmq"),
        ("postgres", "/var/lib/postgresql/data"),
        ("evaluator", "/var/lib/condmsg/archive"),
    }
    for name, target in expected:
        source = _mounts(services[name]).get(target)
        assert source in declared, (name, target, source)
    # RabbitMQ's data directory is named after its host: fixed, the volume's queues are
    # found again when the container is recreated.
    assert services["rabbitmq"]["hostname"] == "rabbitmq"


def test_one_image_is_built_for_the_condmsg_services_with_the_extras_argument(
    tmp_path: Path,
) -> None:
    project = _project(tmp_path, env_file=False)
    plain = _config(project)["services"]
    audit = _config(project, CONDMSG_EXTRAS="audit")["services"]
    images = {plain[name]["image"] for name in CONDMSG_SERVICES}
    assert images == {"condmsg:local"}
    for name in CONDMSG_SERVICES:
        assert Path(plain[name]["build"]["context"]).resolve() == project.resolve(), name
        assert plain[name]["build"]["args"]["EXTRAS"] in ("", None), name
        assert audit[name]["build"]["args"]["EXTRAS"] == "audit", name


def test_compose_holds_no_secret_only_references_to_the_environment() -> None:
    text = (ROOT / "compose.yaml").read_text()
    dotenv = _dotenv(ROOT / ".env.example")
    for key in ("CONDMSG_SECRET", "POSTGRES_PASSWORD", "RABBITMQ_DEFAULT_PASS"):
        assert dotenv[key] not in text, key
    secretish = re.compile(r"SECRET|PASSWORD|_PASS$")
    for name, service in _source()["services"].items():
        for key, value in (service.get("environment") or {}).items():
            if secretish.search(key):
                # The whole value is one ${VAR...} reference, resolved from .env or the shell.
                assert re.fullmatch(r"\$\{[A-Z_]+(:?-[^}]*)?\}", str(value)), (name, key, value)
                default = re.sub(r"^\$\{[A-Z_]+:?-?|\}$", "", str(value))
                assert default in ("", "guest"), (name, key, value)
    # Every password in a URL default is the development broker's guest.
    for user, password in re.findall(r"://([^:/@\s]+):([^@/\s]*)@", text):
        assert (user, password) == ("guest", "guest"), (user, password)


def test_env_example_names_every_setting_compose_reads() -> None:
    referenced = set(re.findall(r"\$\{([A-Z_]+)", (ROOT / "compose.yaml").read_text()))
    documented = set(re.findall(r"^#?([A-Z_]+)=", (ROOT / ".env.example").read_text(), re.M))
    assert referenced == documented


# -- Dockerfile and .dockerignore ---------------------------------------------------------


def _instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of the Dockerfile, continuation lines joined."""
    text = (ROOT / "Dockerfile").read_text()
    logical = re.sub(r"\\\n", " ", text)
    found = []
    for line in logical.splitlines():
        stripped = line.strip()
        if stripped and not stripped.startswith("#"):
            word, _, rest = stripped.partition(" ")
            found.append((word.upper(), rest.strip()))
    return found


def _final_stage() -> list[tuple[str, str]]:
    instructions = _instructions()
    last_from = max(i for i, (word, _) in enumerate(instructions) if word == "FROM")
    return instructions[last_from:]


def test_dockerfile_builds_a_wheel_on_slim_python_in_two_stages() -> None:
    froms = [args for word, args in _instructions() if word == "FROM"]
    assert len(froms) == 2
    assert all(re.match(r"python:\$\{PYTHON_VERSION\}-slim\b", f) for f in froms)
    version = next(a for w, a in _instructions() if w == "ARG" and a.startswith("PYTHON_"))
    assert version.split("=")[1] in ("3.11", "3.12")
    build = " ".join(args for word, args in _instructions() if word == "RUN")
    assert "pip wheel --no-deps" in build
    final = _final_stage()
    assert ("COPY", "--from=build /opt/condmsg /opt/condmsg") in final
    assert not any(word == "COPY" and "--from" not in args for word, args in final)


def test_dockerfile_runs_condmsg_as_an_unprivileged_user() -> None:
    final = _final_stage()
    users = [args for word, args in final if word == "USER"]
    assert users, "no USER in the final stage"
    user = users[-1].split(":")[0]
    assert user not in ("root", "0")
    created = " ".join(args for word, args in final if word == "RUN")
    assert f"--uid {user}" in created
    entrypoint = [args for word, args in final if word == "ENTRYPOINT"]
    assert entrypoint == ['["condmsg"]']
    assert ("EXPOSE", OPS_PORT) in final


@pytest.mark.parametrize(("extras", "requirement"), [("", "W.whl"), ("audit", "W.whl[audit]")])
def test_dockerfile_installs_the_extras_of_its_build_argument(
    extras: str, requirement: str
) -> None:
    instructions = _instructions()
    assert ("ARG", 'EXTRAS=""') in instructions
    assert ("ARG", "EXTRAS") in _final_stage()
    install = next(args for word, args in instructions if word == "RUN" and "pip install" in args)
    spec = re.search(r'pip install ("[^"]+")', install)
    assert spec is not None, install
    # The requirement as the build's /bin/sh expands it for this EXTRAS.
    shell = f"wheel=W.whl; EXTRAS={extras!r}; printf %s {spec[1]}"
    expanded = subprocess.run(["sh", "-c", shell], capture_output=True, text=True, check=True)
    assert expanded.stdout == requirement


def test_dockerignore_lets_in_what_the_wheel_needs_and_keeps_out_the_secret() -> None:
    lines = [
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert lines[0] == "*", "an allowlist: everything out, then what the build needs"
    allowed = {line[1:] for line in lines if line.startswith("!")}
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    packages = project["tool"]["setuptools"]["packages"]["find"]["include"]
    needed = {"pyproject.toml", project["project"]["readme"]}
    needed |= {p.rstrip("*") for p in packages}
    needed |= set(project["project"].get("license-files", []))
    assert needed <= allowed, needed - allowed
    assert not {".env", ".venv", ".git", "tests"} & allowed


def test_compose_has_both_services_with_healthchecks() -> None:
    compose = yaml.safe_load((ROOT / "compose.yaml").read_text())
    services = compose["services"]
    assert "management" in services["rabbitmq"]["image"]
    assert services["postgres"]["image"].startswith("postgres:")
    for name in ("rabbitmq", "postgres"):
        assert services[name]["healthcheck"]["test"], name
    assert "5672:5672" in services["rabbitmq"]["ports"]
    assert "5432:5432" in services["postgres"]["ports"]
