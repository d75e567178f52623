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

.PHONY: setup proto test test-fast demo up down clean bench

setup: $(VENV)/.installed $(PROTO_OUT)

$(VENV)/.installed: pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet -e '.[dev,iceberg]'
	touch $@

proto: $(PROTO_OUT)
$(PROTO_OUT): $(PROTO_SRC) $(VENV)/.installed
	$(BIN)/python -m grpc_tools.protoc -Irsm_sidecar/_proto=proto \
	  --python_out=. --grpc_python_out=. --pyi_out=. $(PROTO_SRC)

# The README's test command: everything from a fresh clone.
test: setup
	$(BIN)/pytest

# Unit and integration tests without the real broker.
test-fast: setup
	$(BIN)/pytest -m 'not e2e'

clean:
	rm -rf rsm_sidecar/_proto build *.egg-info
