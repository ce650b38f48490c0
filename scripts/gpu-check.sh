#!/usr/bin/env bash
# Issue 50's prepared GPU check (docs/gpu.md, "Static step and CUDA graphs"): on a machine with one
# CUDA GPU and torch, transformers, triton and numba installed (a bare checkout is enough: no .venv,
# no network), in well under 8 minutes:
#   1. the versions (GPU, driver, torch, triton, transformers);
#   2. the CUDA tests of the kernels and the static step (pytest -m "not slow");
#   3. scripts/gpu_check.py: step figures beside the HBM floor for the SmolLM2-135M, Llama-3.2-1B and
#      Llama-3.1-8B shapes (random bfloat16 weights built on the GPU), the engine's decode rate at 1
#      and 8 sequences and its bucket fill, graph-vs-eager exactness.
# Writes $OUT/gpu-tests.log and $OUT/gpu-check.json ($OUT defaults to out/).
#
# Usage: scripts/gpu-check.sh [--skip-tests] [--dry-run] [gpu_check.py options, e.g. --models smollm2-135m]
#   --dry-run runs gpu_check.py on the CPU with tiny shapes (and skips the tests): what CI checks.
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT" || exit 2
PY="${PYTHON:-python3}"
if [ -x "$ROOT/.venv/bin/python" ] && [ -z "${PYTHON:-}" ]; then PY="$ROOT/.venv/bin/python"; fi
OUT_DIR="${OUT:-$ROOT/out}"
mkdir -p "$OUT_DIR"
# A bare checkout imports lookupspec from here and maps kernels/ and gateway/ as pyproject does.
export PYTHONPATH="$ROOT:$ROOT/scripts/checkout_site${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1

tests=1
args=()
for a in "$@"; do
  case "$a" in
    --skip-tests) tests=0 ;;
    --dry-run) tests=0; args+=("$a") ;;
    *) args+=("$a") ;;
  esac
done

echo "== versions"
if command -v nvidia-smi >/dev/null 2>&1; then
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader || true
fi
"$PY" - <<'EOF'
import platform, torch, transformers
try:
    import triton
    tv = triton.__version__
except ImportError:
    tv = "not installed"
gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no CUDA device"
print(f"python {platform.python_version()}, torch {torch.__version__} (CUDA {torch.version.cuda}), "
      f"triton {tv}, transformers {transformers.__version__}; {gpu}")
EOF

status=0
if [ "$tests" = 1 ]; then
  echo "== CUDA tests: kernels and the static step"
  # -W default: a newer or older library's deprecation warning is not what this run checks
  timeout 180 "$PY" -m pytest -q -m "not slow" -W default -p no:cacheprovider \
    tests/kernels tests/runtime/static tests/engine/test_device_discipline.py 2>&1 | tee "$OUT_DIR/gpu-tests.log"
  status=${PIPESTATUS[0]}
  echo "== tests exit status $status"
fi

echo "== figures and exactness"
timeout 300 "$PY" scripts/gpu_check.py --out "$OUT_DIR/gpu-check.json" "${args[@]}"
check=$?
[ "$status" = 0 ] && status=$check
exit "$status"
