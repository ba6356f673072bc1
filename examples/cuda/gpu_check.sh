#!/usr/bin/env bash
# Check both kernel examples natively, once, on a machine with an NVIDIA GPU and nvcc:
#   1. build examples/cuda/fp4_quant.cu (examples/cuda/build.py, cached by hash);
#   2. conformance run --device cuda with the CUDA example (quant.e2m1, quant.fp4_*);
#   3. conformance run --device cuda with the Triton example, compiled for the GPU (no
#      TRITON_INTERPRET), on quant.e2m1, quant.fp4_* and indexer.scores;
#   4. conformance run --device cuda with upstream's own torch arithmetic (tests/impls/
#      gate_upstream.py) on the fp8 Linear at every production shape (linear.fp8: wq_a, wq_b,
#      wo_b, the indexer's wq_b) and sparse_attn at production size (d 512, 16 heads, 144 lanes);
#   5. the CUDA example again with -n 2: two isolation children forked from the preloaded fork
#      server (harness/forkserver.py) each initialise CUDA on their own;
#   6. a sticky CUDA error in one case (tests/impls/wrong.py:StickyCudaError, --device cuda -n 2):
#      that case fails, its child is replaced by a fresh fork, every other case passes;
#   7. the production tier's attention case (fp8 checkpoint, 1,030-token prefill) built locally, then
#      run --device cuda with upstream's own torch arithmetic returning its intermediates (the
#      `upstream-gpu` entry of conformance.yaml: torch.topk on a GPU breaks ties in CUDA's order, so
#      selections are judged as sets): every output is judged along the chain (docs/verdicts.md)
#      given the GPU's own values, the prefill's `o` given its own `q` with the logit-scale check;
#   8. the pytest plugin (harness/pytest_cases.py) from an empty folder, as a team's own suite runs
#      it: pytest --conformance-impl <the Triton example> --conformance-device cuda;
#   9. fp8 GEMMs on the GPU's own tensor cores (examples/cuda/scaled_mm_impl.py: torch._scaled_mm per
#      32-wide K block, fp32 promotion across blocks) judged by the accumulator model (docs/verdicts.md,
#      "GPU arithmetic"): linear.fp8 on the small tier, then the production tier's attention case (its
#      fp8 qr, kv, index_q and out) and its indexer cases (the indexer's fp8 wq_b), as `scaled-mm-gpu`;
#  10. outputs left on the GPU by a port run without --device (examples/cuda/left_on_device_check.py,
#      tests/impls/wrong.py:LeftOnDevice): every case a `device error` naming the device, on
#      components judged one by one and along a chain, and the run finishes.
#  11. the fork trap (examples/cuda/fork_trap_check.py): the pytest plugin from a folder whose conftest
#      calls torch.cuda.is_available(), and `conformance run --device cuda -n 2` from a `python -c` that
#      called it first in the same process: the driver is initialised before any child exists, every
#      case still passes, and results.json says the fork server was a fresh interpreter.
#  12. the CPU's stand-in for a GPU (tests/device_standin.py, which `make test` runs ports on) against
#      this GPU (examples/cuda/standin_check.py): every mixed-device pattern it accepts or refuses, the
#      GPU accepts or refuses too;
#  13. upstream's own torch arithmetic on the GPU (`upstream-gpu`) over every small-tier golden, and the reference itself with --device cuda (it computes on the CPU and hands its outputs
#      back on the GPU, for a port that delegates a component): every supported case passes.
#  14. this GPU's bf16 GEMM accumulation (examples/cuda/accumulation_check.py): torch's bf16 GEMM at the
#      compressor's production shapes, each element's error beyond its rounding within the harness's
#      allowance (harness/accumulation.py, BF16_GEMM_ALLOWANCE).
# Each step runs under a time limit and logs to $OUT/<step>.log; a short summary comes last. The
# production goldens (steps 7 and 9) are built on the CPU in the background from the start, so that
# work overlaps the GPU steps before them (step `goldens`, logged like the others).
#
# Usage (from anywhere):  examples/cuda/gpu_check.sh
# Environment: PYTHON (default .venv/bin/python, else python3), GPU_CHECK_LIMIT (seconds per
# step, default 600), GPU_CHECK_DIR (default reports/gpu-check), NVCC, CONFORMANCE_CUDA_ARCH
# (default sm_75 plus PTX; `native` compiles for this GPU only), GPU_CHECK_STEPS (a space-separated
# list of the steps to run, e.g. "production tensorcores" to rerun two; default all).
# Exit status: 0 all steps passed, 1 a step failed or timed out, 2 no usable GPU.

set -u
cd "$(dirname "$0")/../.." || exit 2
PY=${PYTHON:-}
if [ -z "$PY" ]; then
    if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi
fi
LIMIT=${GPU_CHECK_LIMIT:-600}
OUT=${GPU_CHECK_DIR:-reports/gpu-check}
mkdir -p "$OUT"
unset TRITON_INTERPRET  # the point is the native GPU path

if ! "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
    echo "gpu_check: $PY's torch sees no CUDA device (a CPU-only torch, or no GPU/driver);" >&2
    echo "gpu_check: install a CUDA build of torch (pip install -e . keeps it) and run this on the GPU machine" >&2
    exit 2
fi
"$PY" - <<'EOF'
import torch
try:
    import triton
    triton_version = triton.__version__
except ImportError:
    triton_version = "not installed"
print(f"gpu_check: {torch.cuda.get_device_name(0)}, torch {torch.__version__} (CUDA {torch.version.cuda}), "
      f"triton {triton_version}, {torch.cuda.device_count()} device(s)")
EOF

declare -a NAMES RESULTS
STEPS=" ${GPU_CHECK_STEPS:-build cuda triton fp8 forked sticky production plugin tensorcores left-on-gpu fork-trap standin small-tier accumulation} "
chosen() { [[ "$STEPS" == *" $1 "* ]]; }
record() {  # record NAME RC SECONDS: remember a step's outcome, show the log's end if it failed
    local name=$1 rc=$2 took=$3
    local verdict="ok"
    if [ "$rc" -eq 124 ]; then
        verdict="TIMEOUT after ${LIMIT}s"
    elif [ "$rc" -ne 0 ]; then
        verdict="FAILED (exit $rc)"
    fi
    NAMES+=("$name")
    RESULTS+=("$verdict, ${took}s, log $OUT/$name.log")
    if [ "$rc" -ne 0 ]; then
        echo "--- $name: last lines of $OUT/$name.log"
        tail -n 25 "$OUT/$name.log"
    fi
    return "$rc"
}
step() {  # step NAME COMMAND...: run under the limit, log, remember the outcome (skipped if not chosen)
    local name=$1
    shift
    chosen "$name" || return 0
    local started=$SECONDS
    timeout "$LIMIT" "$@" >"$OUT/$name.log" 2>&1
    record "$name" $? $((SECONDS - started))
}

failed=0
# The production goldens, for steps production and tensorcores: CPU work, started now and awaited there.
GOLDENS_PID=
if chosen production || chosen tensorcores; then
    GOLDENS_STARTED=$SECONDS
    timeout "$LIMIT" "$PY" -m v41_conformance generate --tier production --select 'attention/*,indexer/*' \
        >"$OUT/goldens.log" 2>&1 &
    GOLDENS_PID=$!
fi
goldens_ready() {  # wait once for the background build; its outcome is step `goldens`
    [ -n "$GOLDENS_PID" ] || return "${GOLDENS_RC:-0}"
    wait "$GOLDENS_PID"
    GOLDENS_RC=$?
    GOLDENS_PID=
    record goldens "$GOLDENS_RC" $((SECONDS - GOLDENS_STARTED))
}

step build "$PY" examples/cuda/build.py || failed=1
if [ "$failed" -eq 0 ]; then
    step cuda "$PY" -m v41_conformance run --device cuda --impl examples/cuda/cuda_impl.py:CudaImpl \
        --select 'quant.e2m1,quant.fp4_e4m3,quant.fp4_e8m0' --report-dir "$OUT/cuda" || failed=1
fi
step triton "$PY" -m v41_conformance run --device cuda --impl examples/triton_impl.py:TritonImpl \
    --select 'quant.e2m1,quant.fp4_e4m3,quant.fp4_e8m0,indexer.scores' --report-dir "$OUT/triton" || failed=1
step fp8 "$PY" -m v41_conformance run --device cuda --impl tests/impls/gate_upstream.py:UpstreamTorch \
    --select 'linear.fp8,sparse_attn/production-*' --report-dir "$OUT/fp8" || failed=1
step forked "$PY" -m v41_conformance run --device cuda -n 2 --impl examples/cuda/cuda_impl.py:CudaImpl \
    --select 'quant.e2m1,quant.fp4_e4m3,quant.fp4_e8m0' --report-dir "$OUT/forked" || failed=1
step sticky "$PY" examples/cuda/sticky_check.py "$OUT/sticky" || failed=1
goldens_ready || failed=1
step production bash -c "'$PY' -m v41_conformance run --device cuda --tier production --impl upstream-gpu \
    --select 'attention/*' --timeout $LIMIT --report-dir '$OUT/production'" || failed=1
PLUGIN_DIR=$(mktemp -d)
PY_ABS=$("$PY" -c 'import sys; print(sys.executable)')
step plugin bash -c "cd '$PLUGIN_DIR' && '$PY_ABS' -m pytest -q -p no:cacheprovider \
    --conformance-impl '$PWD/examples/triton_impl.py:TritonImpl' --conformance-device cuda \
    --conformance-select 'quant.e2m1,quant.fp4_e8m0,indexer.scores' --conformance-report-dir '$PWD/$OUT/plugin'" \
    || failed=1

goldens_ready || failed=1
step tensorcores bash -c "'$PY' -m v41_conformance run --device cuda --impl examples/cuda/scaled_mm_impl.py:ScaledMmFp8 \
    --select 'linear.fp8' --report-dir '$OUT/tensorcores' && \
    '$PY' -m v41_conformance run --device cuda --tier production --impl scaled-mm-gpu \
    --select 'attention/*,indexer/*' --timeout $LIMIT --report-dir '$OUT/tensorcores-production'" || failed=1
step left-on-gpu "$PY" examples/cuda/left_on_device_check.py "$OUT/left-on-gpu" || failed=1
step fork-trap "$PY" examples/cuda/fork_trap_check.py "$OUT/fork-trap" || failed=1
step standin "$PY" examples/cuda/standin_check.py || failed=1
step accumulation "$PY" examples/cuda/accumulation_check.py || failed=1
step small-tier bash -c "'$PY' -m v41_conformance run --device cuda -n 4 --impl upstream-gpu --report-dir '$OUT/upstream-small'; \
    a=\$?; '$PY' -m v41_conformance run --device cuda -n 4 --impl reference --report-dir '$OUT/reference-cuda' && exit \$a" || failed=1

echo
echo "gpu_check summary"
for i in "${!NAMES[@]}"; do
    printf '  %-12s %s\n' "${NAMES[$i]}" "${RESULTS[$i]}"
done
for name in cuda triton fp8 forked sticky production plugin tensorcores tensorcores-production fork-trap/plugin fork-trap/cli \
    upstream-small reference-cuda; do
    if [ -f "$OUT/$name/results.json" ]; then
        "$PY" - "$OUT/$name/results.json" "$name" <<'EOF'
import json, sys
doc = json.load(open(sys.argv[1]))
parts = [f"{n} {e['verdict']} {e['pass']}/{e['cases']}" for n, e in doc["components"].items()]
print(f"  {sys.argv[2]:<10} " + "; ".join(parts))
EOF
    fi
done
exit "$failed"
