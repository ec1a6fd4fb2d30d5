#!/usr/bin/env bash
# Every CUDA check memlayout has, in one run on a machine with an NVIDIA GPU, each
# step bounded so that the whole fits a short lease. Logs and tables go to $OUT
# (default .gpu-out). Usage: bash benchmarks/gpu/gpu_check.sh
# It uses the machine's own CUDA build of torch; wheels of what that machine lacks
# may lie in .whl/ (pure-Python or cp312 manylinux), installed into /tmp/site first.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-.gpu-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
PYTHON=${PYTHON:-python3}
if compgen -G ".whl/*.whl" >/dev/null; then
  $PYTHON -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site:$PWD
else
  export PYTHONPATH=$PWD
fi
{
  nvidia-smi
  $PYTHON -c "import torch; print(torch.__version__, torch.version.cuda); print(torch.cuda.get_device_properties(0)); print('cudnn', torch.backends.cudnn.version())"
} > "$OUT/device.txt" 2>&1
cat "$OUT/device.txt"
# At most eight files come back from a lent machine, so the steps share one log
# and pytest has its own.
step() {  # step SECONDS LOG COMMAND...: one bounded step, its output kept
  local seconds=$1 log=$2; shift 2
  echo "== $* (limit ${seconds}s)" | tee -a "$OUT/$log"
  timeout -k 5 "$seconds" "$@" >> "$OUT/$log" 2>&1
  echo "== exit $?" | tee -a "$OUT/$log"; tail -n 5 "$OUT/$log"
}
# GPU_CHECK_SKIP="cudnn probe flatten" leaves those steps out, for a short lease that has them already.
want() { [[ " ${GPU_CHECK_SKIP:-} " != *" $1 "* ]]; }
want cudnn && step 45 steps.log $PYTHON tests/cudnn/record_cudnn_layouts.py "$OUT/cudnn-table.json"
want cudnn && mkdir -p tests/cudnn/tables && cp "$OUT/cudnn-table.json" tests/cudnn/tables/ 2>/dev/null
want probe && step 130 steps.log $PYTHON benchmarks/gpu/gpu_probe.py "$OUT/probe.json" "$OUT/llama1b-autocast-snapshot.pickle"
# The caching allocator model: predicted reserved and allocated against max_memory_reserved/allocated (gpt2
# tiny, a small Llama and a 1.1B Llama at 2k tokens under bf16 autocast), and cuBLAS's workspace sizes.
step 200 steps.log env MEMLAYOUT_GPU_LARGE=1 $PYTHON -m pytest -q -s -p no:cacheprovider -o addopts= --timeout 190 \
  -rfEs tests/activations/device/test_reserved_gpu.py
# Every test file with a gpu-marked test, found rather than listed, so a new one is not missed.
# test_reserved_gpu.py runs real steps in fresh processes, a 1B Llama among them: its own step above.
mapfile -t GPU_TESTS < <(grep -rlE "pytest\.mark\.gpu|mark\.gpu" tests --include='test_*.py' \
  | grep -v 'tests/activations/device/test_reserved_gpu.py' | sort)
step ${GPU_TESTS_SECONDS:-220} pytest-gpu.log $PYTHON -m pytest -q -p no:cacheprovider -o addopts= --timeout 60 -rfEs \
  "${GPU_TESTS[@]}" tests/test_private_torch_apis.py tests/core/test_cudnn_layout.py
# --device cuda predictions with a GPU present: what the H200 predicted (probe-h200.json) and --gpu naming
# another GPU than this one; memlayout's backward loop (used where no GPU is) against torch's engine.
step 150 steps.log $PYTHON -m pytest -q -p no:cacheprovider -o addopts= --timeout 140 -rfEs \
  tests/activations/trace/test_fake_cuda.py tests/activations/step/test_gpu_free_backward.py
want flatten && step 45 steps.log $PYTHON benchmarks/gpu/bench_flatten_gpu.py --size-mib 256 --tensors 200
want flatten && cp benchmarks/results/gpu/flatten_gpu.json "$OUT/" 2>/dev/null
ls -la "$OUT"
