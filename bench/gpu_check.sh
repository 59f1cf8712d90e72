#!/bin/bash
# The CUDA checks and figures, on a lent GPU machine (the device tool) whose image has torch and
# Triton but not this project's other dependencies, run from the repository root there.
# Before the call, here: download the missing packages as cp312 wheels into an ignored `.whl/`
# (pydantic, pydantic-core, pydantic-settings, annotated-types, typing-inspection, python-dotenv,
# structlog, gguf, protobuf, bcrypt, cryptography, cffi, pycparser, redis, opentelemetry-api/-sdk/
# -semantic-conventions: `pip download --no-deps --only-binary=:all: --python-version 3.12 ...`),
# commit, and write `git rev-parse --short HEAD > .whl/commit; git rev-parse 'HEAD^{tree}' > .whl/tree`;
# then call with `carry: [".whl"]`. Results are stamped with that commit only when the copied
# files' git tree hash equals it (the machine's git history is older than the session's).
# TESTS, TEST_LIMIT, SKIP_KQUANT, SKIP_BENCH and BENCH_LIMIT narrow a run.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
R=$PWD
export PYTHONPATH=/tmp/site:$R/libs/common:$R/libs/pqc:$R/services/shard-node:$R/services/coordinator:$R/services/gateway:$R/services/telemetry:$R/services/cli:$R/proto/gen:$R
export PYTHONUNBUFFERED=1
nvidia-smi -L; python3 -c "import torch, triton; print(torch.__version__, triton.__version__)"
tree=$(GIT_INDEX_FILE=/tmp/idx git add -A -- . ':!.whl' && GIT_INDEX_FILE=/tmp/idx git write-tree)
echo "tree $tree, expected $(cat .whl/tree)"
[ "$tree" = "$(cat .whl/tree)" ] && export MOHAWK_RESULTS_COMMIT=$(cat .whl/commit)
TESTS=${TESTS:-tests/shard/model/test_groupwise_triton.py tests/shard/model/test_cuda_graph_step.py tests/shard/model/test_kquant_cuda.py tests/shard/engine/test_cuda.py}
timeout "${TEST_LIMIT:-200}" python3 -m pytest -q -s -o addopts="" -p no:cacheprovider $TESTS 2>&1 | tee "$OUT/tests.log" | grep -E "passed|failed|FAILED|Error|padded steps|rows: max" | tail -40
[ -n "$SKIP_KQUANT" ] || timeout 120 python3 bench/kquant_cuda.py 2>&1 | tee "$OUT/kquant.log"
[ -n "$SKIP_BENCH" ] && exit 0
cd bench && timeout "${BENCH_LIMIT:-200}" python3 cuda_graph_decode.py --tokens 128 --repeats 3 --json "$OUT/cuda-graph-decode-h200.json" 2>&1 | grep -v "^2026" | tail -20
