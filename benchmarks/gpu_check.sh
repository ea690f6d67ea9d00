#!/usr/bin/env bash
# The GPU checks of issue 55 in one run of a few minutes (`make bench-gpu`), so that time on a
# GPU machine goes to measuring, not to typing. Run from the repository root, with a Python whose
# torch is a CUDA build (your own: tformer is used from src/, nothing is installed):
#
#     PY=python benchmarks/gpu_check.sh [OUT_DIR]       # OUT_DIR (default gpu-check/) gets every output
#
# Each step has its own time limit and the script goes on when one fails; summary.txt says what
# each gave. Steps (about 2 + 5 + 2 minutes on an H200):
#   1. the device tests: `pytest --device cuda -m "gpu or device"` (the GPU-only tests, and every
#      device-aware test of the suite on the GPU);
#   2. `tformer bench --device cuda --tf32`: BERT-base training against HF BertModel (fp32, fp32 in
#      TF32, bf16 autocast, bf16 compiled at the plan's batch and at 4x it; MFU in the GEMM
#      roofline column, the target >= 40%), sentence embeddings against sentence-transformers and
#      ONNX Runtime's CUDA provider (where onnxruntime-gpu is installed);
#   3. a one-minute timed run (`tformer train --max-minutes 1 --device cuda`) on the repository's
#      examples, whose log says which rung of the sizing ladder a GPU's measured steps afford.
# A lease shorter than the steps' limits sets them (seconds): PYTEST_LIMIT, BENCH_LIMIT, TRAIN_LIMIT;
# RUN_ROOT puts the timed run's folder elsewhere than OUT_DIR (when only a few files may come back).
set -u
PY=${PY:-python}
OUT=${1:-${OUT:-gpu-check}}
mkdir -p "$OUT"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
summary="$OUT/summary.txt"
: > "$summary"

step() {  # step NAME LIMIT_SECONDS COMMAND...: run, keep its output, note its status and time
    local name=$1 limit=$2
    shift 2
    local start=$SECONDS
    timeout --signal=TERM --kill-after=20 "$limit" "$@" > "$OUT/$name.txt" 2>&1
    local rc=$?
    echo "$name: exit $rc after $((SECONDS - start)) s ($*)" | tee -a "$summary"
}

{
    echo "date: $(date -u +%FT%TZ)"
    git rev-parse HEAD 2>/dev/null | sed 's/^/commit: /'
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader 2>&1 | sed 's/^/gpu: /'
    lscpu | grep 'Model name' | sed 's/^ *//'
    "$PY" -c "import torch, sys; print('python', sys.version.split()[0], '| torch', torch.__version__, '| cuda', torch.version.cuda, '| available', torch.cuda.is_available())"
    for m in transformers sentence_transformers onnxruntime triton; do
        "$PY" -c "import $m; print('$m', $m.__version__)" 2>/dev/null || echo "$m: not installed"
    done
} | tee -a "$summary"

step pytest "${PYTEST_LIMIT:-240}" "$PY" -m pytest --device cuda -m "gpu or device" -q -x -p no:cacheprovider
step bench "${BENCH_LIMIT:-420}" "$PY" -m tformer bench --device cuda --tf32 --json "$OUT/bench.json"
run="${RUN_ROOT:-$OUT}/run-$(date +%s)"
step train "${TRAIN_LIMIT:-150}" "$PY" -m tformer train --data examples/en_de.jsonl --max-minutes 1 --device cuda --out "$run"
grep -h -E "^(model size|precision|device|batch)" "$OUT/train.txt" | sed 's/^/train: /' | tee -a "$summary"
sed -n '/^| workload | target/,/^$/p' "$OUT/bench.txt" | tee -a "$summary"
