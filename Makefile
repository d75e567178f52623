# One entry point for set-up, tests and the demo. Every target sets up what it needs
# on a fresh machine; downloads go to $(CACHE) (git-ignored).
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
CACHE ?= .cache
export RSM_CACHE_DIR := $(abspath $(CACHE))

PROTO_SRC := proto/rsm/v1/rsm.proto
PROTO_OUT := rsm_sidecar/_proto/rsm/v1/rsm_pb2_grpc.py

SHIM_JAR := java-shim/target/rsm-sidecar-shim.jar
SHIM_SRC := java-shim/pom.xml $(PROTO_SRC) docs/shim.md $(shell find java-shim/src -type f 2>/dev/null)
BCPROV := $(CACHE)/interop/bcprov-jdk18on-1.83.jar
KAFKA_STAMP := $(CACHE)/.kafka-jars-$(or $(KAFKA_VERSION),default)
KAFKA39_STAMP := $(CACHE)/.kafka-jars-3.9.2
RUNTIME_STAMP := $(VENV)/.installed-runtime
ICEBERG_STAMP := $(CACHE)/.iceberg-deps
ICEBERG_LOCAL_STAMP := $(CACHE)/.iceberg-jars-local
SERVERS_STAMP := $(CACHE)/.storage-servers
COMPOSE_TOOLS_STAMP := $(CACHE)/.compose-tools
K8S_TOOLS_STAMP := $(CACHE)/.k8s-tools
TOPOLOGY ?= local
# `make test` builds `deps` several targets at a time; Maven 3.8's local repository is not safe
# for two Maven processes at once, so each Maven run on ~/.m2 holds this lock (devstack.common's
# user_maven_lock; devstack.kafka's own repository in $(CACHE)/m2 has its lock).
ONE_MAVEN := mkdir -p $(abspath $(CACHE)) && flock $(abspath $(CACHE))/.maven.lock

.PHONY: prereqs-demo compose-demo compose-down lint setup proto shim kafka-jars interop-jars iceberg-deps storage-servers compose-tools k8s-tools helm-schema deps demo-deps test test-fast test-unit demo up down clean bench docs

setup: $(VENV)/.installed $(PROTO_OUT)

# Everything the tests need, downloaded into $(CACHE) or built.
deps: setup k8s-tools compose-tools storage-servers shim kafka-jars $(KAFKA39_STAMP) interop-jars iceberg-deps

# The tools `make demo` and `make up` need on the machine (Python, a JDK, Maven), checked first so that
# a missing one is named at once (devstack/prereqs.py; `make test` checks its own list first).
prereqs-demo:
	@$(PYTHON) -m devstack.prereqs demo

# What `make demo` and `make up` use, and nothing more: the sidecar's runtime with PySpark and
# PyIceberg (no dev tools), the Iceberg Spark runtime and SQLite JDBC jars (no cloud bundles: the
# demo's table is in a local catalog), the shim and Kafka's jars. STORAGE=s3|gcs|azure installs
# its server when first started.
demo-deps: $(RUNTIME_STAMP) $(PROTO_OUT) shim kafka-jars $(ICEBERG_LOCAL_STAMP)

# pip works on the virtualenv one run at a time (`make -j` may start both installs): the runtime's
# install, behind the full one, then finds its stamp fresh and does nothing. Where the full one
# is wanted, it goes first.
VENV_LOCK = mkdir -p $(CACHE) && flock $(CACHE)/.venv.lock
ifneq ($(filter setup lint deps test test-fast test-unit docs helm-schema,$(MAKECMDGOALS)),)
$(RUNTIME_STAMP): | $(VENV)/.installed
endif

$(VENV)/.installed: pyproject.toml
	$(VENV_LOCK) sh -c 'set -e; test -x $(BIN)/python || $(PYTHON) -m venv $(VENV); \
	  $(BIN)/pip install --quiet -e ".[dev,demo,iceberg,s3,gcs,azure]"; touch $@ $(RUNTIME_STAMP)'

$(RUNTIME_STAMP): pyproject.toml
	$(VENV_LOCK) sh -c 'set -e; test $@ -nt pyproject.toml && exit 0; \
	  test -x $(BIN)/python || $(PYTHON) -m venv $(VENV); \
	  $(BIN)/pip install --quiet -e ".[demo,iceberg,s3,gcs,azure]"; touch $@'

proto: $(PROTO_OUT)
$(PROTO_OUT): $(PROTO_SRC) $(RUNTIME_STAMP)
	$(BIN)/python -m grpc_tools.protoc -Irsm_sidecar/_proto=proto \
	  --python_out=. --grpc_python_out=. --pyi_out=. $(PROTO_SRC)

shim: $(SHIM_JAR)
# Builds, unit-tests (JUnit) and shades the Java shim; rebuilt only when its sources change.
$(SHIM_JAR): $(SHIM_SRC)
	cd java-shim && $(ONE_MAVEN) mvn -q -B package
	touch $@

kafka-jars: $(KAFKA_STAMP)
$(KAFKA_STAMP): devstack/kafka-jars.pom.xml | $(RUNTIME_STAMP)
	$(BIN)/python -m devstack.kafka jars
	touch $@
# the 3.x compatibility tests
$(KAFKA39_STAMP): devstack/kafka-jars.pom.xml | $(RUNTIME_STAMP)
	KAFKA_VERSION=3.9.2 $(BIN)/python -m devstack.kafka jars
	touch $@

# The Iceberg Spark runtime and SQLite JDBC: what the demo's local catalog needs.
$(ICEBERG_LOCAL_STAMP): rsm_sidecar/iceberg/jars.py | $(RUNTIME_STAMP)
	$(BIN)/python -m rsm_sidecar.iceberg.jars --no-cloud
	touch $@

# Iceberg Spark runtime, SQLite JDBC, AWS/GCP bundles, and the Apicurio schema registry.
iceberg-deps: $(ICEBERG_STAMP)
$(ICEBERG_STAMP): rsm_sidecar/iceberg/jars.py devstack/registry.py | $(VENV)/.installed
	$(BIN)/python -m rsm_sidecar.iceberg.jars
	$(BIN)/python -m devstack.registry
	touch $@

# SeaweedFS (S3), fake-gcs-server (GCS) and Azurite (Azure Blob, npm) for the tests and
# `make demo STORAGE=s3|gcs|azure`.
storage-servers: $(SERVERS_STAMP)
$(SERVERS_STAMP): devstack/s3server.py devstack/gcsserver.py devstack/azurite.py
	$(PYTHON) -m devstack.s3server install
	$(PYTHON) -m devstack.gcsserver install
	$(PYTHON) -m devstack.azurite install
	touch $@

# docker compose (built from the Go module proxy) and BuildKit's Dockerfile checks, which
# tests/compose uses to validate docker-compose.yml without a Docker engine.
compose-tools: $(COMPOSE_TOOLS_STAMP)
$(COMPOSE_TOOLS_STAMP): devstack/compose_tools.py tests/compose/tools/go.mod
	$(PYTHON) -c 'from devstack.compose_tools import ensure_compose_cli, ensure_dockerfilecheck; \
	  print(ensure_compose_cli()); print(ensure_dockerfilecheck())'
	touch $@

# The Kubernetes deployment tests' tools (tests/deploy, devstack/k8s_tools.py): helm built from
# the Go module proxy; promtool out of Debian's prometheus package (apt-get download; built from
# the Go module proxy where there is no apt); Strimzi's CRDs generated from io.strimzi:api (Maven Central) by
# Strimzi's CRD generator; cert-manager's and the Prometheus operator's CRDs from their Go
# modules; the Prometheus JMX exporter agent (Maven Central).
k8s-tools: $(K8S_TOOLS_STAMP)
$(K8S_TOOLS_STAMP): devstack/k8s_tools.py
	$(PYTHON) -m devstack.k8s_tools
	touch $@

# Regenerate the Helm chart's values.schema.json from the configuration code.
helm-schema: setup
	$(BIN)/python -m devstack.helm_schema

interop-jars: $(BCPROV)
$(BCPROV):
	$(ONE_MAVEN) mvn -q -B dependency:copy -Dartifact=org.bouncycastle:bcprov-jdk18on:1.83 -DoutputDirectory=$(CACHE)/interop

# The README's test command: everything from a fresh clone. The lint and the downloads and builds
# of `deps` run five at a time, each target's output printed in one piece when it ends. The three
# Go builds (docker compose, helm, fake-gcs-server: 2 cores for about 4 minutes) run on the
# machine's $(PYTHON) (their modules import only the standard library), so they start at once,
# beside pip's install of the virtualenv and the shim's build; Maven runs on ~/.m2 one at a time
# (ONE_MAVEN). The set-up is CPU-bound: running the Go builds at a lower priority let pip end
# 3 minutes sooner but the set-up no sooner (7.7 min against 7.3). The tests run in three lanes
# at once (tests/lanes.py).
test:
	$(PYTHON) -m devstack.prereqs test
	$(MAKE) --no-print-directory --output-sync=target -j5 lint deps
	$(BIN)/python -m tests.lanes

# Style and types: ruff (lint + format check) and mypy, configured in pyproject.toml.
lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

# The fast inner loop: unit tests only (no server, no download, no broker; tiers in tests/conftest.py).
# Needs only `make setup`.
test-unit: setup
	$(BIN)/pytest -m unit

# Unit and integration tests without the real broker.
test-fast: deps
	$(BIN)/pytest -m 'not e2e'

clean:
	rm -rf rsm_sidecar/_proto build *.egg-info java-shim/target

# Regenerate the generated part of docs/configuration.md from the code.
docs: setup
	{ cat docs/configuration.md.head; echo '<!-- BEGIN GENERATED: rsm-sidecar config docs -->'; \
	  $(BIN)/rsm-sidecar config docs; echo '<!-- END GENERATED -->'; } > docs/configuration.md

# The demo on the embedded default (local-directory storage); STORAGE=s3|gcs|azure selects a
# local S3 (SeaweedFS), GCS (fake-gcs-server) or Azure Blob (Azurite) server instead.
demo: prereqs-demo demo-deps
	$(BIN)/python -m devstack.cli demo

# A tiered-storage broker on 127.0.0.1:9092 for manual use, in the background; logs in run/stack/.
# BROKERS=3 (or more): a controller and brokers on 127.0.0.1:9092-9094, a sidecar each, one
# shared object store; logs in run/cluster/. `make down` stops either.
BROKERS ?= 1
up: prereqs-demo demo-deps
	mkdir -p run
	nohup $(BIN)/python -m devstack.cli up --brokers $(BROKERS) > run/stack.out 2>&1 < /dev/null &
	for i in $$(seq 1 120); do grep -q '^up:' run/stack.out 2>/dev/null && break; \
	  if grep -q -i 'error\|Traceback' run/stack.out 2>/dev/null; then cat run/stack.out; exit 1; fi; sleep 1; done; cat run/stack.out

down:
	$(BIN)/python -m devstack.cli down

# docker-compose.yml on podman (installed, configured and given a debian:bookworm-slim base
# image here when missing; devstack/containers.py, devstack/compose_demo.py): build, up, the demo's summary. The cluster
# keeps running until `make compose-down`. TOPOLOGY=remote: docker-compose.remote.yml, the
# sidecar as its own workload (TCP + mTLS, stream mode, no shared volume; docs/kubernetes.md).
compose-demo: setup shim compose-tools
	$(BIN)/python -m devstack.compose_demo demo --topology $(TOPOLOGY)

compose-down: setup
	$(BIN)/python -m devstack.compose_demo down --topology $(TOPOLOGY)

# Every benchmark, one after the other (each prints its own table; about 15 minutes).
# Each also runs on its own: see the command in its docstring.
bench: deps
	$(BIN)/python benchmarks/pipeline.py
	$(BIN)/python benchmarks/heuristic.py
	$(BIN)/python -m benchmarks.storage_backends
	$(BIN)/python benchmarks/shim.py
	$(BIN)/python benchmarks/remote_read.py
	$(BIN)/python benchmarks/grpc_stream.py
	$(BIN)/python benchmarks/disk_cache.py
	$(BIN)/python -m benchmarks.inspect_startup
	$(BIN)/python benchmarks/iceberg_decode.py
	$(BIN)/python benchmarks/iceberg_convert.py
	$(BIN)/python benchmarks/iceberg_source.py
	$(BIN)/python benchmarks/iceberg_freshness.py
	$(BIN)/python benchmarks/iceberg_cluster.py
	$(BIN)/python benchmarks/soak.py
