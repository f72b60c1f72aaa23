# Set-up and everyday commands. `make serve` and `make test` are the two the README documents;
# `make test` (what .ci/run runs) runs `make lint` first and installs the tritonserver / perf_analyzer
# peers (from the package registry), so the tests that compare with tritonserver run instead of skipping.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: install ssh-peers serve validate test test-fast test-multinode test-gpu lint bench-peers peers clean

# uv (from the package registry) installs the same packages pip resolves, in seconds instead of
# minutes; like pip here, it looks in $PIP_FIND_LINKS first (where the CPU build of torch is), and it
# compiles the bytecode as pip does (else every new Ray process compiles Ray's modules on its first
# import). Where uv cannot be had or cannot reach the registry, pip does the same install.
UV := $(BIN)/uv
FIND_LINKS := $(foreach dir,$(PIP_FIND_LINKS),--find-links $(dir))

$(BIN)/activate:
	$(PY) -m venv $(VENV)

install: $(BIN)/activate
	@[ -x $(UV) ] || $(BIN)/pip install -q uv || echo "uv not installed: pip installs instead"
	@if [ -x $(UV) ] && $(UV) pip install -q --compile-bytecode --python $(BIN)/python $(FIND_LINKS) torch==2.13.0 -e ".[cpu,dev]"; \
	then :; else \
	  $(BIN)/pip install -q torch==2.13.0 && $(BIN)/pip install -q -e ".[cpu,dev]"; \
	fi
	@$(MAKE) -s ssh-peers

# sshd and rsync for `ray up` on Ray's local provider (tests/cluster/test_ray_up_local.py), as root where
# apt-get is; never fails the install (without them that test skips and says why).
ssh-peers:
	@if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && \
	  { [ ! -x /usr/sbin/sshd ] || ! command -v rsync >/dev/null; }; then \
	  export DEBIAN_FRONTEND=noninteractive; \
	  apt-get install -y -qq openssh-server rsync >/dev/null 2>&1 || \
	  { apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq openssh-server rsync >/dev/null 2>&1; } || \
	  echo "openssh-server / rsync not installed: the ray up test will skip"; \
	fi

# `serve run` with the request-path variables; it ends when make does (SIGTERM to make included).
serve: install
	$(BIN)/python -m deployments.serve.launch run serve_config.yaml

validate: install
	$(BIN)/triton-serve validate examples/model_repository

# lint and the peers' install side by side: one is CPU, the other mostly unpacking wheels
test: install
	@$(MAKE) -s -j2 --output-sync=target lint peers
	TRITON_SERVE_REQUIRE_PEERS=1 $(BIN)/python -m pytest -q

test-fast: install
	$(BIN)/python -m pytest -q -m "not serve"

# Ray nodes in network namespaces on this machine, and `ray up` on them (needs root; docs/multinode.md).
test-multinode: install
	$(BIN)/python -m pytest -q -m multinode tests/cluster

# The GPU paths alone (tests marked gpu; those in tests/serve_gpu start Ray). Needs CUDA, and the gpu
# extra for ONNX Runtime / TensorRT.
test-gpu:
	$(PY) -m pytest -q -rs -m gpu tests/backends tests/ensembles tests/serve_gpu

lint:
	$(BIN)/ruff check . && $(BIN)/ruff format --check . && $(BIN)/mypy

bench-peers: install peers

peers:
	$(BIN)/pip install -q "nvidia-cuda-runtime-cu12==12.*"
	$(BIN)/python -m bench peers

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .mypy_cache
