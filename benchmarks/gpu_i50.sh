#!/usr/bin/env bash
# Issue 50: the real policies' gap to a replay of the same MATH-shaped routes, in one device call (~5 min, < 8).
#
#   bash benchmarks/gpu_i50.sh                    # one H200 (nvidia-h200), from the repository root
#   EXTRA=--dry-run-cpu SCALE=0.02 VARIANT=graphs bash benchmarks/gpu_i50.sh   # tiny models on the CPU: checks it
#
# 0. the GPU test that the graphs record the forcing (tests/fast/test_forced_routes.py, B = 4, FastConfig()).
# 1. engine_shapes.py --fresh, B = 1: Qwen3-8B / 0.6B and Qwen2-7B / 1.5B, each pair in a fresh process with empty
#    compile caches, under the entropy rule, the router (R-Stitch+, the stitched route) and a replay (the bound);
#    the other rows of benchmarks/results/engine_shapes_<gpu>.json are kept (--merge, marked *).
# 2. engine_batched.py --variant auto, B = 8: the same two pairs (--pair qwen3, --pair qwen2), entropy and replay.
# The models' entropies are forced to follow the routes (lab.RoutedPair): the policies decide them themselves.
# Results under $OUT (7 files): engine_shapes_<gpu>.{json,md}, engine_batched_qwen3_<gpu>_policies.{json,md},
# engine_batched_<gpu>_policies.{json,md} (figures: engine_batched.plot(json) redraws them), run.log; the gap
# table (stitched seconds of each policy over the replay's) prints last.
set -uo pipefail
OUT="${OUT:-/tmp/out}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 PYTHONPATH="$PWD:$PWD/benchmarks${PYTHONPATH:+:$PYTHONPATH}"
SCALE="${SCALE:-1.0}" VARIANT="${VARIANT:-auto}"
t0=$SECONDS
{
  python3 -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__,
"gpu", torch.cuda.get_device_name() if torch.cuda.is_available() else None)'
  # the forcing inside captured graphs (GPU tier test, 4 rows, FastConfig()): ~20 s
  timeout -k 10 150 python3 -m pytest -q -p no:cacheprovider tests/fast/test_forced_routes.py \
    -k "record_the_forcing and 4-graphs" 2>&1 | tail -3
  gpu_json=$(ls benchmarks/results/engine_shapes_nvidia_h200.json 2>/dev/null)
  timeout -k 10 300 python3 benchmarks/engine_shapes.py --out-dir "$OUT" --fresh --budget-s 270 --scale "$SCALE" \
    --pairs qwen3-8b/qwen3-0.6b qwen2-7b/qwen2-1.5b --models --policies entropy router replay \
    ${gpu_json:+--merge "$gpu_json"} ${EXTRA:-}
  echo "engine_shapes done at $((SECONDS - t0)) s"
  for pair in qwen3 qwen2; do
    left=$((465 - (SECONDS - t0)))
    timeout -k 10 "$left" python3 benchmarks/engine_batched.py --out-dir "$OUT" --pair "$pair" --variant "$VARIANT" \
      --batches 8 --slm-only-batches --skip-baselines --policies entropy replay --scale "$SCALE" \
      --budget-s $((left - 15)) --tag _policies ${EXTRA:-}
    echo "engine_batched --pair $pair done at $((SECONDS - t0)) s"
  done
} 2>&1 | tee "$OUT/run.log" | grep --line-buffered -v '^{' | cut -c1-300  # the full lines (JSON too) in run.log
rm -f "$OUT"/*.png  # at most 8 files come back; the figures redraw from the JSON
python3 - "$OUT" <<'EOF'
import json, sys
from pathlib import Path

print("\n| pair | B | policy | stitched (s) | vs replay | route met |\n|---|---|---|---|---|---|")
for path in sorted(Path(sys.argv[1]).glob("engine_*.json")):
    doc = json.loads(path.read_text())
    if path.name.startswith("engine_shapes"):
        for p in doc["pairs"]:
            if not p.get("from_run"):
                vs = f"{p['vs_replay']:.3f}" if p.get("vs_replay") else "-"
                st = f"{p['stitched_s']:.3f}" if p.get("stitched_s") else "-"
                print(f"| {p['llm']} / {p['slm']} | 1 | {p['policy']} | {st} | {vs} | {p.get('roles_match')} |")
    else:
        rows = [r for r in doc["rows"] if r["method"] == "stitched"]
        replay = {r["batch"]: r["seconds"] for r in rows if r.get("policy") == "replay"}
        for r in rows:
            vs = f"{r['seconds'] / replay[r['batch']]:.3f}" if r["batch"] in replay else "-"
            print(f"| {doc['args']['pair']} | {r['batch']} | {r['policy']} | {r['seconds']:.3f} | {vs} | "
                  f"{r['roles_match']} |")
EOF
echo "total $((SECONDS - t0)) s"
