#!/usr/bin/env bash
# Issue 48 on one H200, a device call per mode. Run from the repository root with .wheels carried: the server's web
# stack and pytest, which the GPU image lacks, fetched here for CPython 3.12 with `python3 -m pip download --no-deps
# --only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64 --platform
# manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .wheels` of: fastapi==0.165.0 starlette==1.10.0
# uvicorn==0.54.0 httptools==0.9.0 pydantic==2.13.4 pydantic-core==2.46.4 annotated-types==0.7.0
# typing-inspection==0.4.2 typing-extensions==4.16.0 annotated-doc==0.0.7 opentelemetry-api==1.45.2 h11==0.16.0
# click==8.5.1 anyio==4.16.0 pytest==9.0.3 pluggy==1.6.0 iniconfig==2.3.0 pytest-xdist==3.8.0 execnet==2.1.2
# hypothesis==6.155.2 sortedcontainers attrs packaging==26.4 py-spy==0.4.3 (the versions tested here; py-spy for
# serve_reasoning.py --spy, its binary in /tmp/site/bin).
#
#   bash benchmarks/gpu_i48.sh serve [ARGS...]      # serve_reasoning.py (rstitch serve's default engine) + ARGS
#   bash benchmarks/gpu_i48.sh tests [PYTEST...]    # the GPU tier (make test-gpu), or pytest over PYTEST
#   bash benchmarks/gpu_i48.sh tests-then-serve ARGS  # both in one call: the tier first (<= $TESTS_S s)
#   bash benchmarks/gpu_i48.sh variants [ARGS...]   # engine_variants.py: the engine alone, join settings compared
#   bash benchmarks/gpu_i48.sh tests-then-variants ARGS  # the GPU tier first (<= $TESTS_S s), then variants ARGS
#   bash benchmarks/gpu_i48.sh diag                 # host_syncs.py and request_host_gpu.py: synchronizing calls
#                                                   # inside a step, and the host's own work a step (~2 min)
#   bash benchmarks/gpu_i48.sh profile [ARGS...]    # join_profile.py (where a step's device time goes, joins apart)
#                                                   # and gc_pauses.py (the collector's pauses, frozen or not)
#   bash benchmarks/gpu_i48.sh virtual [ARGS...]    # joins read as virtual rows: their tests on CUDA, then the
#                                                   # engine alone at 8, 64 and 256 clients, twin against virtual rows
#                                                   # (engine_variants_<gpu>_virtual; ARGS replace its levels etc.)
#   bash benchmarks/gpu_i48.sh math METHOD [ARGS...]  # the server at MATH's lengths (--scale 0.9), 256 clients, one
#                                                   # method a call (llm_only ~7.5 min, stitched ~5 min), the engine
#                                                   # alone beside it: serve_reasoning_<gpu>_split_math_<METHOD>; then
#                                                   # here: python benchmarks/serve_reasoning.py --merge A.json B.json
#                                                   # --tag _math --out-dir benchmarks/results (one table, both methods)
#
# Results under $OUT: serve_reasoning_<gpu><tags>.{json,md,png}, engine_variants_<gpu>.{json,md,png}, gpu_tests.txt,
# host_syncs_<gpu>.{json,md}, request_host_<gpu>.{json,md}, join_profile_<gpu>.{json,md}, gc_pauses_<gpu>.{json,md},
# and the server logs in logs.tgz.
set -uo pipefail
OUT="${OUT:-/tmp/out}"
mkdir -p "$OUT"
t0=$SECONDS
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .wheels/*.whl \
  || { echo "FAILED: the wheels in .wheels did not install (carry .wheels)"; exit 1; }
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 PYTHONPATH="$PWD:$PWD/benchmarks:/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
export PATH="/tmp/site/bin:$PATH"  # py-spy
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

variants() {  # engine_variants.py with the given arguments (default: default, join_wait=0, prefill_chunk=512)
  python3 benchmarks/engine_variants.py --out-dir "$OUT" "$@" 2>"$OUT/variants.err" | tail -30
  tail -5 "$OUT/variants.err"
  echo "variants done at $((SECONDS - t0)) s"
}

diag() {  # where a step could wait for the device, and what the host does a step (tiny pair: the host's time)
  timeout 150 python3 benchmarks/host_syncs.py --out-dir "$OUT" 2>/dev/null | grep "^|"
  timeout 300 python3 benchmarks/request_host_gpu.py --out-dir "$OUT" "$@" 2>&1 | grep "^\["
  echo "diag done at $((SECONDS - t0)) s"
}

profile() {  # where a serving step's device time goes by part (torch.profiler), and the collector's pauses
  timeout 200 python3 benchmarks/join_profile.py --out-dir "$OUT" "$@" 2>/dev/null | grep "^|"
  timeout 240 python3 benchmarks/gc_pauses.py --device cuda --pair qwen2 --clients 256 --out-dir "$OUT" 2>/dev/null | grep "^|"
  echo "profile done at $((SECONDS - t0)) s"
}

mode="${1:-serve}"; shift || true
case "$mode" in
  serve) serve "$@" ;;
  tests) tests "$@" ;;
  tests-then-serve) tests; serve "$@" ;;
  variants) variants "$@" ;;
  tests-then-variants) tests; variants "$@" ;;
  diag) diag "$@" ;;
  profile) profile "$@" ;;
  virtual) TESTS_S=200 tests -n 4 -k "virtual" tests/fast/test_virtual_rows.py tests/fast/test_fast_gpu.py
           variants --variants fast.virtual_joins=0 default \
             --levels 8 64 256 --warmup-s 3 --window-s 6 --budget-s 360 --tag _virtual "$@" ;;
  math) method="${1:?math METHOD: llm_only or stitched (both do not fit one call)}"; shift
        serve --scale 0.9 --levels 256 --warmup-s 30 --window-s 20 --startup-s 300 --budget-s 540 --methods "$method" \
          --tag "_math_$method" "$@" ;;
  *) echo "unknown mode $mode: serve, tests, tests-then-serve, variants, tests-then-variants, diag, profile, virtual or math"; exit 2 ;;
esac
