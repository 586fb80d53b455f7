# syntax=docker/dockerfile:1
# One image for the outbox relay, the evaluator and the CLI (docs/operations.md, "Deploying"):
#
#   docker build -t condmsg .                          # sender, receiver, relay, evaluator, CLI
#   docker build -t condmsg:audit --build-arg EXTRAS=audit .   # plus the Spark audit, export
#                                                      # and retention's Parquet, with a JRE
#   docker run --rm condmsg db upgrade --store sender  # the entrypoint is `condmsg`
#
# The services serve /metrics, /healthz and /readyz on --metrics-port (compose.yaml uses
# 9464); the image has no curl, so a healthcheck asks with Python's urllib.

# Pinned to a patch release on a Debian release, as compose.yaml pins its images: a rebuild
# next year starts from the same interpreter. Python's dependencies are pinned by
# requirements.lock (tools/lock_requirements.py), given to pip as constraints.
ARG PYTHON_VERSION=3.12.8
# Optional extras of the condmsg package, comma-separated: "" or "audit".
ARG EXTRAS=""

# -- build: the wheel, then a virtualenv with it and its dependencies ------------------------
FROM python:${PYTHON_VERSION}-slim-bookworm AS build
ARG EXTRAS
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
WORKDIR /src
# .dockerignore lets in only what the wheel is built from and the lock (no .env, secrets,
# .venv, tests or .git).
COPY . .
RUN python -m pip wheel --no-deps --wheel-dir /wheels . \
 && python -m venv /opt/condmsg \
 && wheel="$(ls /wheels/condmsg-*.whl)" \
 && /opt/condmsg/bin/pip install --constraint requirements.lock "${wheel}${EXTRAS:+[${EXTRAS}]}"

# -- runtime: the virtualenv on a clean slim image, run as an unprivileged user --------------
FROM python:${PYTHON_VERSION}-slim-bookworm
ARG EXTRAS
# PySpark needs a Java runtime; the audit's JDBC reader Debian's PostgreSQL driver
# (spark_audit.session.DEFAULT_JDBC_JAR). Only when the audit extra is asked for.
RUN case ",${EXTRAS}," in *,audit,*) \
      apt-get update \
      && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
           default-jre-headless libpostgresql-jdbc-java procps \
      && rm -rf /var/lib/apt/lists/* ;; \
    esac
# A fixed uid/gid so that volumes and runAsNonRoot policies can name it. /var/lib/condmsg
# is its home and working directory; retention's archives go to .../archive (a volume in
# compose.yaml, created here so that a new named volume takes its owner).
RUN groupadd --system --gid 10001 condmsg \
 && useradd --system --uid 10001 --gid condmsg --home-dir /var/lib/condmsg --create-home \
      --shell /usr/sbin/nologin condmsg \
 && install -d -o condmsg -g condmsg /var/lib/condmsg/archive
COPY --from=build /opt/condmsg /opt/condmsg
ENV PATH=/opt/condmsg/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    CONDMSG_ARCHIVE_DIR=/var/lib/condmsg/archive
USER 10001:10001
WORKDIR /var/lib/condmsg
EXPOSE 9464
ENTRYPOINT ["condmsg"]
CMD ["--help"]
