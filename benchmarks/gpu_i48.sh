#!/usr/bin/env bash
# Issue 48 on one H200, a device call per mode. Run from the repository root with .wheels carried (the server's web
# stack and pytest, which the GPU image lacks: fastapi, starlette, uvicorn, pydantic, h11, click, anyio, pytest,
# pytest-xdist, hypothesis and their needs, as `pip download --no-deps ... -d .wheels` for CPython 3.12 fetched them).
#
#   bash benchmarks/gpu_i48.sh serve [ARGS...]      # serve_reasoning.py (rstitch serve's default engine) + ARGS
#   bash benchmarks/gpu_i48.sh tests [PYTEST...]    # the GPU tier (make test-gpu), or pytest over PYTEST
#   bash benchmarks/gpu_i48.sh tests-then-serve ARGS  # both in one call: the tier first (<= $TESTS_S s)
#
# Results under $OUT: serve_reasoning_<gpu><tags>.{json,md,png}, gpu_tests.txt, and the server logs in logs.tgz.
set -uo pipefail
OUT="${OUT:-/tmp/out}"
mkdir -p "$OUT"
t0=$SECONDS
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .wheels/*.whl \
  || { echo "FAILED: the wheels in .wheels did not install (carry .wheels)"; exit 1; }
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 PYTHONPATH="$PWD:$PWD/benchmarks:/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
python3 -c 'import torch, transformers, fastapi; print("torch", torch.__version__, "transformers", transformers.__version__,
"fastapi", fastapi.__version__, torch.cuda.get_device_name(0))'

tests() {  # the GPU tier, or the pytest arguments given
  if [ $# -gt 0 ]; then
    timeout -s INT "${TESTS_S:-240}" python3 -m pytest -q -rfEs -p no:cacheprovider "$@" 2>&1 | tee "$OUT/gpu_tests.txt" | tail -15
  else
    make test-gpu PYTHON=python3 GPU_TIMEOUT="${TESTS_S:-240}" GPU_RESULT="$OUT/gpu_tests.txt" >/dev/null 2>&1
    tail -12 "$OUT/gpu_tests.txt"
  fi
  echo "tests done at $((SECONDS - t0)) s"
}

serve() {  # serve_reasoning.py with the given arguments; server logs kept in logs.tgz
  export TMPDIR=/tmp/sr_work && mkdir -p "$TMPDIR"
  python3 benchmarks/serve_reasoning.py --out-dir "$OUT" "$@" 2>"$OUT/serve.err" | tail -40
  tail -5 "$OUT/serve.err"
  tar czf "$OUT/logs.tgz" -C /tmp/sr_work . "$OUT/serve.err" 2>/dev/null; rm -f "$OUT/serve.err"
  echo "serve done at $((SECONDS - t0)) s"
}

mode="${1:-serve}"; shift || true
case "$mode" in
  serve) serve "$@" ;;
  tests) tests "$@" ;;
  tests-then-serve) tests; serve "$@" ;;
  *) echo "unknown mode $mode: serve, tests or tests-then-serve"; exit 2 ;;
esac
