# condmsg: the two commands are `make demo` and `make test` (see README.md).
SHELL := /bin/bash
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

# The PostgreSQL JDBC driver the Spark audit's JDBC reader (and its tests) load, from
# Debian's libpostgresql-jdbc-java (Maven is not reachable here).
JDBC_JAR := /usr/share/java/postgresql.jar
SUDO := $(if $(filter 0,$(shell id -u)),,sudo)

.PHONY: demo test lint bench soak services install clean audit-dist prepared-transactions

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

$(JDBC_JAR):
	$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libpostgresql-jdbc-java \
	  || { $(SUDO) apt-get update -qq \
	       && $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libpostgresql-jdbc-java; }

# `docker-compose config` validates compose.yaml in tests/unit/test_deploy_files.py (no
# Docker engine needed): Debian's docker-compose.
COMPOSE := /usr/bin/docker-compose
$(COMPOSE):
	$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker-compose \
	  || { $(SUDO) apt-get update -qq \
	       && $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker-compose; }

# Headless Chromium for tests/spark/test_report_browser.py, which opens the audit's report.
CHROMEDRIVER := /usr/bin/chromedriver
$(CHROMEDRIVER):
	$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver \
	  || { $(SUDO) apt-get update -qq \
	       && $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver; }

# The Node.js receiver of interop/node, which the conformance tests run (amqplib and pg at
# the versions its package-lock.json pins).
NODE_MODULES := interop/node/node_modules/.package-lock.json
$(NODE_MODULES): interop/node/package.json interop/node/package-lock.json
	command -v npm >/dev/null || $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm \
	  || { $(SUDO) apt-get update -qq \
	       && $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm; }
	npm ci --prefix interop/node --no-audit --no-fund

services: $(STAMP)
	$(BIN)/python -m condmsg.cli check-services

# Spheres' prepared transactions need max_prepared_transactions > 0 (docs/spheres.md).
prepared-transactions:
	bash .ci/prepared-transactions

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

test: $(STAMP) $(JDBC_JAR) $(COMPOSE) $(CHROMEDRIVER) $(NODE_MODULES) prepared-transactions services lint
	$(BIN)/pytest -n 2 --dist loadgroup --durations=25

demo: $(STAMP) prepared-transactions services
	$(BIN)/python -m condmsg.demo

bench: $(STAMP) services
	$(BIN)/python -m bench --record

# The pipeline for an hour at half its burst rate (bench/soak.py); not part of `make bench`.
soak: $(STAMP) services
	$(BIN)/python -m bench --record soak

# What spark-submit's --py-files needs to run the audit on a cluster (docs/audit.md).
audit-dist: $(STAMP)
	$(BIN)/python -m spark_audit.dist dist/condmsg-audit.zip

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache .hypothesis
