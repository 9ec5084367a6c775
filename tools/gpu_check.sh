#!/usr/bin/env bash
# The CUDA checks as one prepared run on a GPU machine (README, "On a GPU"): the conformance
# suite of every GPU built-in, the benchmarks on the GPU (its own matmul peaks and bandwidth),
# the report, and tools/gpu_probe.py's facts.  Run from the repository root:
#   OUT=/some/folder bash tools/gpu_check.sh
# asv may be missing there: wheels in .whl/ are installed first (pip download, as the device
# README says).  Everything lands in $OUT: env.txt, probe.json, suites.log, bench.log, asv-folders.txt, tests.log,
# triton.log, triton.json, report.tgz.
set -u
OUT=${OUT:-$PWD/gpu-check}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false  # several JAX processes share the GPU
GPU_BACKENDS=${GPU_BACKENDS:-"torch-sdpa-cuda-flash torch-sdpa-cuda-efficient torch-sdpa-cuda-cudnn torch-sdpa-cuda-math jax-dpa-cudnn"}
# the serving kernels (backends/serving_cuda.py): packed and paged calls only, so the suites and not the padded
# benchmarks; flash_attn and flashinfer are skipped with their reason where they are not installed
SERVING_BACKENDS=${SERVING_BACKENDS:-"torch-varlen-cuda flash-attn-varlen-cuda flash-attn-kvcache-cuda flashinfer-prefill-cuda flashinfer-decode-cuda"}
# fp8 inputs with descales (backends/fp8_cuda.py; issue 31): PyTorch's quantised SDPA (FA3), FA3's own when installed
FP8_BACKENDS=${FP8_BACKENDS:-"torch-sdpa-fp8-cuda flash-attn3-fp8-cuda"}
start=$SECONDS
say() { echo "[gpu-check $((SECONDS - start)) s] $*"; }

say "environment and install" | tee "$OUT/env.txt"
{
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  python3 -c "import torch, jax; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'cudnn',
torch.backends.cudnn.version(), torch.cuda.get_device_name(0)); print('jax', jax.__version__, jax.devices())"
  for m in flash_attn flashinfer flash_attn_interface; do python3 -c "import $m; print('$m', $m.__version__)" 2>&1 | tail -1; done
  if [ -d .whl ]; then python3 -m pip install -q --no-index --no-deps .whl/*.whl; fi
  python3 -m pip install -q --no-deps --no-build-isolation -e .
  if ! git rev-parse HEAD >/dev/null 2>&1; then  # the copy may come without .git: asv needs a commit
    git init -q && git add -A && git -c user.name=gpu-check -c user.email=gpu-check@localhost commit -qm "working tree"
  fi
  attnspec backends
} >> "$OUT/env.txt" 2>&1

say "probe"
timeout 60 python3 tools/gpu_probe.py > "$OUT/probe.json" 2> "$OUT/probe.err"

backend_args=""
for b in $GPU_BACKENDS $SERVING_BACKENDS $FP8_BACKENDS; do backend_args="$backend_args --backend $b"; done
say "suites: $GPU_BACKENDS $SERVING_BACKENDS $FP8_BACKENDS"
# --suite-timeout bounds each backend's suite; the outer timeout only stops a hang of the run itself
timeout "${SUITES_LIMIT:-280}" attnspec run --no-bench $backend_args --jobs 8 \
  --suite-timeout "${SUITE_TIMEOUT:-260}" --out "$OUT/suites" > "$OUT/suites.log" 2>&1
say "suites exit $?"

say "benchmarks"
commit=$(git rev-parse HEAD)
# the folders this run's asv processes wrote, one a line, for the report (as `attnspec run` passes them on)
ATTNSPEC_BENCH_JOBS=${BENCH_JOBS:-3} timeout "${BENCH_LIMIT:-180}" python3 tools/gpu_bench.py "$commit" \
  "$OUT/asv-folders.txt" $GPU_BACKENDS > "$OUT/bench.log" 2>&1
say "benchmarks exit $?"
mapfile -t inputs < <(cat "$OUT/asv-folders.txt" 2>/dev/null)
if [ -d "$OUT/suites" ]; then inputs+=("$OUT/suites"); fi  # none where no GPU backend could run: benchmarks only
attnspec report "${inputs[@]}" --out "$OUT/report" >> "$OUT/bench.log" 2>&1
say "report exit $?"
say "own tests with a GPU"
timeout 90 python3 -m pytest -q -p no:cacheprovider tests/test_backends_errors.py tests/test_backends_contract.py \
  tests/test_bench_report.py > "$OUT/tests.log" 2>&1
say "tests exit $?"
say "the Triton example on CUDA (docs/examples/triton_attention.py; needs triton, in torch's CUDA wheels)"
if python3 -c "import triton" 2>/dev/null; then
  # compiled for the GPU, not interpreted: float16, bfloat16 and float32, every property, 6 problems each
  env -u TRITON_INTERPRET ATTNSPEC_PROFILE=ci timeout "${TRITON_LIMIT:-240}" python3 -m pytest --pyargs attnspec.properties \
    -q -p no:cacheprovider --backend docs.examples.triton_attention:TritonAttention \
    --attnspec-json "$OUT/triton.json" > "$OUT/triton.log" 2>&1
  say "triton exit $?"
else
  say "triton is not installed: the example was not checked" | tee "$OUT/triton.log"
fi
tar czf "$OUT/report.tgz" -C "$OUT" report suites 2>/dev/null
rm -rf "$OUT/report" "$OUT/suites"  # only files come back from the device machine
say "done"
