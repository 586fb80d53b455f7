"""The deployment files: compose.yaml as docker compose resolves it (on a fresh clone, and
with a .env made from .env.example), and the Dockerfile and .dockerignore read statically,
since no Docker engine runs here to build the image.

The validator is ``docker compose`` where the plugin is installed, else ``docker-compose``
(Debian's, which ``make test`` installs). Neither needs an engine for ``config``."""

from __future__ import annotations

import http.server
import os
import re
import shutil
import subprocess
import sys
import threading
import time
import tomllib
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
SERVICES = {"rabbitmq", "postgres", "migrate", "relay", "evaluator"}
SECRET_FILES = ("condmsg_secret", "postgres_password", "rabbitmq_password")
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


def _secret_name(entry: str | dict[str, str]) -> str:
    """The secret a service's ``secrets:`` entry names (short or long syntax)."""
    return entry if isinstance(entry, str) else entry["source"]


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


def test_compose_refuses_to_start_on_a_fresh_clone_without_the_env_file(tmp_path: Path) -> None:
    done = subprocess.run(
        [*_compose_command(), "-f", "compose.yaml", "config"],
        cwd=_project(tmp_path, env_file=False),
        env={"PATH": os.environ["PATH"], "HOME": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0
    assert "cp .env.example .env and create the secret files" in done.stderr, done.stderr


def test_compose_takes_the_settings_from_the_env_file_and_every_secret_from_a_file(
    tmp_path: Path,
) -> None:
    dotenv = _dotenv(ROOT / ".env.example")
    resolved = _config(_project(tmp_path, env_file=True))
    services = resolved["services"]
    evaluator = services["evaluator"]
    assert evaluator["command"][evaluator["command"].index("--sender") + 1] == "app"
    # Each secret is one file of CONDMSG_SECRETS_DIR, mounted where the services read it.
    secrets_dir = (tmp_path / dotenv["CONDMSG_SECRETS_DIR"]).resolve()
    files = {name: Path(spec["file"]) for name, spec in resolved["secrets"].items()}
    assert files == {name: secrets_dir / name for name in SECRET_FILES}
    for name, service in services.items():
        mounted = {_secret_name(s) for s in service.get("secrets", [])}
        for key, value in (service.get("environment") or {}).items():
            if key.endswith("_FILE"):
                assert value.startswith("/run/secrets/"), (name, key, value)
                assert value.removeprefix("/run/secrets/") in mounted, (name, key, value)
    expected = {
        "migrate": {"postgres_password"},
        "relay": {"postgres_password", "rabbitmq_password"},
        "evaluator": {"postgres_password", "rabbitmq_password", "condmsg_secret"},
        "postgres": {"postgres_password"},
        "rabbitmq": {"rabbitmq_password"},
    }
    for name, wanted in expected.items():
        assert {_secret_name(s) for s in services[name].get("secrets", [])} == wanted, name
    for name in CONDMSG_SERVICES:
        env = services[name]["environment"]
        user = dotenv["POSTGRES_USER"]
        assert env["CONDMSG_DB_URL"] == (
            f"postgresql+psycopg://{user}@postgres:5432/{dotenv['POSTGRES_DB']}"
        )
        assert env["CONDMSG_DB_PASSWORD_FILE"] == "/run/secrets/postgres_password"
    assert services["evaluator"]["environment"]["CONDMSG_SECRET_FILE"] == (
        "/run/secrets/condmsg_secret"
    )
    for name in ("relay", "evaluator"):
        env = services[name]["environment"]
        user = dotenv["RABBITMQ_DEFAULT_USER"]
        assert env["CONDMSG_AMQP_URL"] == f"amqp://{user}@rabbitmq:5672/%2F", name
    # RabbitMQ reads its first user's password from the secret as it starts.
    assert "cat /run/secrets/rabbitmq_password" in " ".join(services["rabbitmq"]["entrypoint"])
    assert "RABBITMQ_DEFAULT_PASS" not in services["rabbitmq"]["environment"]


def test_no_trust_authentication_and_no_default_password(tmp_path: Path) -> None:
    postgres = _config(_project(tmp_path, env_file=True))["services"]["postgres"]["environment"]
    assert postgres["POSTGRES_HOST_AUTH_METHOD"] == "scram-sha-256"
    assert "--auth-local=scram-sha-256" in postgres["POSTGRES_INITDB_ARGS"]
    assert "--auth-host=scram-sha-256" in postgres["POSTGRES_INITDB_ARGS"]
    assert "POSTGRES_PASSWORD" not in postgres
    text = (ROOT / "compose.yaml").read_text() + (ROOT / ".env.example").read_text()
    settings = re.sub(r"#.*", "", text)  # what compose reads, without the comments
    assert "trust" not in settings and "guest" not in settings


def test_every_service_is_health_checked_and_the_services_wait_for_the_schema(
    tmp_path: Path,
) -> None:
    services = _config(_project(tmp_path, env_file=True))["services"]
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
        assert f'BASE = "http://127.0.0.1:{OPS_PORT}"' in test[3], name
        assert '"/readyz"' in test[3] and '"/healthz"' in test[3], name
        assert service["restart"] == "unless-stopped", name
    # One relay per store: the evaluator leaves publishing to the relay service.
    assert "--no-relay" in services["evaluator"]["command"]


def test_state_lives_in_named_volumes(tmp_path: Path) -> None:
    resolved = _config(_project(tmp_path, env_file=True))
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
    project = _project(tmp_path, env_file=True)
    plain = _config(project)["services"]
    audit = _config(project, CONDMSG_EXTRAS="audit")["services"]
    images = {plain[name]["image"] for name in CONDMSG_SERVICES}
    assert images == {"condmsg:local"}
    for name in CONDMSG_SERVICES:
        assert Path(plain[name]["build"]["context"]).resolve() == project.resolve(), name
        assert plain[name]["build"]["args"]["EXTRAS"] in ("", None), name
        assert audit[name]["build"]["args"]["EXTRAS"] == "audit", name


def test_compose_and_the_env_file_hold_no_secret(tmp_path: Path) -> None:
    secretish = re.compile(r"SECRET|PASSWORD|_PASS$")
    for name, service in _source()["services"].items():
        for key in service.get("environment") or {}:
            if secretish.search(key):
                assert key.endswith("_FILE"), (name, key)
    for key in _dotenv(ROOT / ".env.example"):
        assert not secretish.search(key) or key == "CONDMSG_SECRETS_DIR", key
    # No URL carries a password: each is filled in from its secret file.
    for name, service in _config(_project(tmp_path, env_file=True))["services"].items():
        for key, value in (service.get("environment") or {}).items():
            if "://" in str(value):
                assert urlsplit(str(value)).password is None, (name, key)


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
    # A patch release, so that a rebuild starts from the same interpreter.
    assert re.fullmatch(r"3\.1[12]\.\d+", version.split("=")[1]), version
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
    spec = re.search(r'pip install --constraint requirements\.lock ("[^"]+")', install)
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
    assert "127.0.0.1:5672:5672" in services["rabbitmq"]["ports"]
    assert "127.0.0.1:5432:5432" in services["postgres"]["ports"]


# -- the hardening of compose.yaml, item by item (docs/security.md, "Hardening checklist") --


def _resolved(tmp_path: Path) -> dict[str, Any]:
    services: dict[str, Any] = _config(_project(tmp_path, env_file=True))["services"]
    return services


def check_ports_on_loopback(services: dict[str, Any]) -> None:
    """Every published port listens on the host's loopback only."""
    for name, service in services.items():
        for port in service.get("ports", []):
            host_ip = port.get("host_ip") if isinstance(port, dict) else port.split(":")[0]
            assert host_ip == "127.0.0.1", (name, port)
    assert {p if isinstance(p, str) else p["target"] for p in services["postgres"]["ports"]}


def check_secrets_from_files(services: dict[str, Any]) -> None:
    """Every credential reaches a container as a /run/secrets file, none in its environment."""
    for name, service in services.items():
        for key, value in (service.get("environment") or {}).items():
            if re.search(r"SECRET|PASSWORD|_PASS$", key):
                assert key.endswith("_FILE") and value.startswith("/run/secrets/"), (name, key)


def check_no_trust_authentication(services: dict[str, Any]) -> None:
    """PostgreSQL asks every connection for a password."""
    postgres = services["postgres"]["environment"]
    assert postgres["POSTGRES_HOST_AUTH_METHOD"] == "scram-sha-256"
    assert "--auth-local=scram-sha-256" in postgres["POSTGRES_INITDB_ARGS"]


def check_pinned_images(services: dict[str, Any]) -> None:
    """Each image a patch release (or a digest), never a moving major or minor tag."""
    # PostgreSQL's releases since 10 are MAJOR.MINOR, RabbitMQ's MAJOR.MINOR.PATCH.
    patch = {"rabbitmq": r":\d+\.\d+\.\d+\b", "postgres": r":\d+\.\d+\b"}
    for name, release in patch.items():
        image = services[name]["image"]
        assert re.search(f"{release}|@sha256:[0-9a-f]{{64}}$", image), (name, image)


def check_log_rotation(services: dict[str, Any]) -> None:
    """Every container's log is rotated."""
    for name, service in services.items():
        logging = service["logging"]
        assert logging["driver"] == "json-file", name
        assert re.fullmatch(r"\d+[km]", logging["options"]["max-size"]), name
        assert int(logging["options"]["max-file"]) >= 2, name


def check_resource_limits(services: dict[str, Any]) -> None:
    """Every container has a memory, CPU and process limit."""
    for name, service in services.items():
        assert service.get("mem_limit"), name
        assert float(service.get("cpus", 0)) > 0, name
        assert int(service.get("pids_limit", 0)) > 0, name


def check_unprivileged_condmsg(services: dict[str, Any]) -> None:
    """condmsg's containers keep no capability and cannot gain privileges."""
    for name in CONDMSG_SERVICES:
        assert services[name]["cap_drop"] == ["ALL"], name
        assert "no-new-privileges:true" in services[name]["security_opt"], name


def check_liveness_restarts(services: dict[str, Any]) -> None:
    """A hung relay or evaluator is ended by its healthcheck and restarted by compose."""
    for name in LONG_RUNNING:
        service = services[name]
        assert service["init"] is True, name  # the service is docker-init's child
        assert service["restart"] == "unless-stopped", name
        assert service["environment"]["CONDMSG_WATCHDOG"] == "1", name
        assert '"/healthz"' in service["healthcheck"]["test"][3], name


#: The checklist's checkable items (their `<!-- check: NAME -->` markers) and their checks.
CHECKS = {
    "ports-on-loopback": check_ports_on_loopback,
    "secrets-from-files": check_secrets_from_files,
    "no-trust-authentication": check_no_trust_authentication,
    "pinned-images": check_pinned_images,
    "log-rotation": check_log_rotation,
    "resource-limits": check_resource_limits,
    "unprivileged-condmsg": check_unprivileged_condmsg,
    "liveness-restarts": check_liveness_restarts,
}


def test_compose_follows_every_checkable_item_of_the_hardening_checklist(tmp_path: Path) -> None:
    security = (ROOT / "docs" / "security.md").read_text()
    checklist = security.split("## Hardening checklist", 1)[1].split("\n## ", 1)[0]
    marked = re.findall(r"<!-- check: ([a-z-]+) -->", checklist)
    assert len(marked) == len(set(marked)), marked
    assert set(marked) == set(CHECKS), set(marked) ^ set(CHECKS)
    services = _resolved(tmp_path)
    for name in marked:
        CHECKS[name](services)


@pytest.mark.parametrize(
    ("check", "breaks"),
    [
        (check_ports_on_loopback, {"rabbitmq": {"ports": ["5672:5672"]}}),
        (check_pinned_images, {"postgres": {"image": "postgres:16"}}),
        (check_log_rotation, {"relay": {"logging": {"driver": "json-file", "options": {}}}}),
        (check_resource_limits, {"migrate": {"mem_limit": None}}),
    ],
)
def test_the_checks_fail_on_what_they_refuse(
    tmp_path: Path, check: Any, breaks: dict[str, dict[str, Any]]
) -> None:
    services = _resolved(tmp_path)
    for name, changes in breaks.items():
        services[name] |= changes
    with pytest.raises((AssertionError, KeyError)):
        check(services)


def _liveness_script(port: int) -> str:
    test = _source()["x-health"]["test"]
    assert test[3].count(f'"http://127.0.0.1:{OPS_PORT}"') == 1
    return str(test[3]).replace(f'"http://127.0.0.1:{OPS_PORT}"', f'"http://127.0.0.1:{port}"')


@pytest.fixture
def unhealthy_port() -> Iterator[int]:
    """A server whose /healthz answers 503, as a service whose loop no longer turns."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(503 if self.path == "/healthz" else 200)
            self.end_headers()
            self.wfile.write(b"the relay's loop has not turned for 60 s\n")

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield int(server.server_address[1])
    finally:
        server.shutdown()
        server.server_close()


def test_the_healthcheck_ends_a_service_that_is_not_live(
    tmp_path: Path, unhealthy_port: int
) -> None:
    """Run in a PID namespace whose PID 1 is named docker-init (compose's init) with a child
    standing for the service: the check kills the child, so init and the container exit."""
    init = tmp_path / "docker-init"
    init.write_text('#!/bin/sh\nsleep 120 &\n"$@"\nstatus=$?\nwait\nexit $status\n')
    init.chmod(0o755)
    env = {"PATH": os.environ["PATH"], "CONDMSG_WATCHDOG": "1"}
    command = [str(init), sys.executable, "-c", _liveness_script(unhealthy_port)]
    started = time.monotonic()
    done = subprocess.run(
        ["unshare", "--pid", "--fork", "--mount-proc", *command],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert time.monotonic() - started < 60  # the sleep standing for the service was killed
    assert done.returncode == 1, done.stderr
    assert done.stderr.startswith("not live: the relay's loop has not turned"), done.stderr


def test_the_healthcheck_signals_nothing_outside_compose(unhealthy_port: int) -> None:
    # Without CONDMSG_WATCHDOG (and with this machine's PID 1), not live is only reported.
    env = {"PATH": os.environ["PATH"]}
    done = subprocess.run(
        [sys.executable, "-c", _liveness_script(unhealthy_port)],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 1
    assert done.stderr.startswith("not live: ")


# -- the lock of the image's Python dependencies -------------------------------------------


def test_the_lock_pins_every_dependency_the_image_installs_within_pyproject() -> None:
    lines = (ROOT / "requirements.lock").read_text().splitlines()
    pins = {}
    for line in lines:
        if line and not line.startswith("#"):
            name, _, version = line.partition("==")
            pins[canonicalize_name(name)] = version
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = list(project["dependencies"])
    for extra in ("audit", "console"):
        wanted += project["optional-dependencies"][extra]
    for line in wanted:
        requirement = Requirement(line)
        name = canonicalize_name(requirement.name)
        assert name in pins, f"{name} is not in requirements.lock: run tools/lock_requirements.py"
        assert requirement.specifier.contains(pins[name], prereleases=True), (line, pins[name])
    assert "psycopg-binary" in pins  # what psycopg[binary] adds: the image has no compiler
    install = " ".join(args for word, args in _instructions() if word == "RUN")
    assert "--constraint requirements.lock" in install
    assert "!requirements.lock" in (ROOT / ".dockerignore").read_text()
