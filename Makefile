# Two commands on a fresh Debian machine: `make demo` and `make test`. Each installs only what is missing.
SHELL := /bin/bash
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
RUNNER_DIR := cdc_pipeline/capture/debezium_runner
RUNNER_JAR := $(RUNNER_DIR)/target/debezium-runner.jar
RUNNER_SOURCES := $(RUNNER_DIR)/pom.xml $(shell find $(RUNNER_DIR)/src/main -name '*.java')
# The tests' scripted SQL Server and Oracle sources: the runner's test source set, in a jar of its own.
SCRIPTED_JAR := $(RUNNER_DIR)/target/debezium-runner-scripted.jar
SCRIPTED_SOURCES := $(shell find $(RUNNER_DIR)/src/test -name '*.java')

.PHONY: setup system-packages runner scripted-sources demo demo-stop test unit-test wheel wheel-test dagster-ui clean

setup: system-packages $(VENV)/.installed $(RUNNER_JAR) $(VENV)/.jvm-archive

# Debian packages for Python 3.11, the JDK and Maven (the runner build), and the local database servers.
system-packages:
	@missing=""; \
	command -v $(PYTHON) >/dev/null || missing="$$missing python3.11 python3.11-venv"; \
	command -v java >/dev/null || missing="$$missing openjdk-17-jdk-headless"; \
	command -v mvn >/dev/null || missing="$$missing maven"; \
	{ command -v mariadbd || test -x /usr/sbin/mariadbd; } >/dev/null || missing="$$missing mariadb-server mariadb-client"; \
	ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || missing="$$missing postgresql"; \
	if [ -n "$$missing" ]; then \
	  echo "Installing Debian packages:$$missing"; \
	  $(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq $$missing; \
	fi

$(VENV)/.installed: pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	@touch $@

# The Java half of the Debezium runner: pinned official Debezium artifacts from Maven Central. Its test source set
# (the scripted sources) is left out.
$(RUNNER_JAR): $(RUNNER_SOURCES)
	cd $(RUNNER_DIR) && mvn -q -B package -Dmaven.test.skip=true
	@touch $@

runner: $(RUNNER_JAR)

# The scripted sources' jar, for the tests alone (tests/helpers/scripted_source.py puts it on the driver classpath):
# the test source set compiled and packaged, the runner's jar left as it is (the JVM class archive is keyed by it).
$(SCRIPTED_JAR): $(RUNNER_JAR) $(SCRIPTED_SOURCES)
	cd $(RUNNER_DIR) && mvn -q -B test-compile jar:test-jar@scripted-jar
	@touch $@

scripted-sources: $(SCRIPTED_JAR)

# The driver JVM's class archive (a shorter start for every run); a run without it only starts slower.
$(VENV)/.jvm-archive: $(RUNNER_JAR) $(VENV)/.installed
	$(PY) -m cdc_pipeline.ops.cli jvm-archive || echo "warning: no JVM class archive; runs start without it"
	@touch $@

demo: setup
	$(PY) -m cdc_pipeline.testing.demo

demo-stop:
	@test -x $(PY) && $(PY) -m cdc_pipeline.testing.demo stop || true

# The suite in two passes: its tests spread over TEST_WORKERS processes (pytest-xdist; each has its own throwaway
# servers and Spark session, a test module's tests stay in one process), then the tests marked `alone` (they count
# Spark's jobs or a run's budget, which a busy machine changes), one at a time.
TEST_WORKERS ?= 2

test: setup $(SCRIPTED_JAR)
	$(VENV)/bin/lint-imports --no-cache
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile -m "not alone" --durations=15; spread=$$?; \
	$(PY) -m pytest -m alone --durations=5; alone=$$?; \
	test $$spread = 0 -a $$alone = 0

unit-test: setup
	$(PY) -m pytest -m "not integration"

# The wheel (in dist/): the engine with the Debezium runner's jars. assets/ and resources/ stay in the checkout,
# where workspace.yaml loads them.
wheel: $(RUNNER_JAR) $(VENV)/.installed
	$(PY) -m pip wheel -q --no-deps -w dist .

# The wheel in a fresh virtual environment of each Python 3.11 to 3.13 found (on the PATH, else pyenv's), its
# dependencies from the package index, syncing a connector against throwaway servers. `make test` runs the same
# test on the venv's Python alone, with the venv's dependencies.
WHEEL_PYTHONS ?= $(shell for v in 3.11 3.12 3.13; do for p in $$(command -v python$$v) $$HOME/.pyenv/versions/$$v*/bin/python$$v; do \
                   "$$p" -c '' 2>/dev/null && echo "$$p" && break; done; done)

wheel-test: setup
	CDC_WHEEL_PYTHONS="$(WHEEL_PYTHONS)" $(PY) -m pytest tests/packaging/test_wheel.py

# Dagster's UI and daemon with a pipeline server beside them (its runs' cycles run in the server's warm JVM; the
# server stops with them). A token is made unless one is set.
dagster-ui: setup
	set -a; . .demo/env; set +a; \
	export CDC_PIPELINE_SERVER="$$PWD/.demo/pipeline.sock"; \
	export CDC_PIPELINE_SERVER_TOKEN="$${CDC_PIPELINE_SERVER_TOKEN:-$$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')}"; \
	$(VENV)/bin/cdc-pipeline serve > .demo/pipeline-server.log 2>&1 & server=$$!; \
	trap 'kill $$server 2>/dev/null; wait $$server' EXIT INT TERM; \
	$(VENV)/bin/dagster dev -w workspace.yaml

clean: demo-stop
	rm -rf $(VENV) $(RUNNER_DIR)/target .demo build dist
