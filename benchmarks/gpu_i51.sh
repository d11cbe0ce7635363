#!/usr/bin/env bash
# Issue 51 on one GPU in one device call (~7.5 min): the generic profile (every Hopper-only feature off: what an
# Ampere / Ada GPU gets) against the native one for the Qwen2 7B alone and the 7B / 1.5B pair at B = 1 and 8, the
# on-machine proof's cost, and the zoo's "auto" rows at B = 3 with thresholds next to observed entropies.
#
#   bash benchmarks/gpu_i51.sh           # all of the above; results in $OUT/i51_results.tgz (+ run.log)
#   TOTAL=520 ZOO_ONLY=llama,phi3 bash benchmarks/gpu_i51.sh   # a longer budget; the zoo over some model_types
#   bash benchmarks/gpu_i51.sh targets   # only tools/kernel_targets.py, 16 compile threads (no GPU needed; ~5 min)
#
# Run from the repository root. Unpack with `tar xzf i51_results.tgz -C benchmarks/results`: engine_shapes_<gpu>
# and engine_shapes_<gpu>_generic (.json/.md), engine_batched_<gpu>_i51 and engine_batched_<gpu>_i51_generic
# (.json/.md/.png), proof_cost_<gpu>.json, zoo_<gpu>.json/.md, the logs.
set -uo pipefail
OUT="${OUT:-/tmp/out}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 PYTHONPATH="$PWD:$PWD/benchmarks${PYTHONPATH:+:$PYTHONPATH}"
t0=$SECONDS
W=$(mktemp -d /tmp/i51.XXXX)
trap 'tar czf "$OUT/i51_results.tgz" -C "$W" . ; echo "results: $(ls "$W" | tr "\n" " ")"' EXIT
left() { echo $((${TOTAL:-450} - (SECONDS - t0))); }  # TOTAL: the whole run's seconds
step() {  # step NAME SECONDS COMMAND...: at most SECONDS (and what is left of the budget), output to NAME.log
  local name=$1 limit=$2; shift 2
  local budget; budget=$(left)
  [ "$budget" -lt "$limit" ] && limit=$budget
  if [ "$limit" -lt 20 ]; then echo "SKIPPED $name: ${budget} s left"; return; fi
  echo "== $name (<= $limit s, at $((SECONDS - t0)) s)"
  timeout -k 5 "$limit" "$@" >"$W/$name.log" 2>&1
  echo "   rc $? after $((SECONDS - t0)) s: $(tail -c 600 "$W/$name.log" | tail -1 | cut -c1-500)"
}
python3 -c 'import torch, transformers, triton; print("torch", torch.__version__, "transformers", transformers.__version__,
"triton", triton.__version__, torch.cuda.get_device_name(0), torch.cuda.get_device_capability(0))'
gpu=$(python3 -c 'import re, torch; print(re.sub(r"[^a-z0-9]+", "_", torch.cuda.get_device_name(0).lower()).strip("_"))')

if [ "${1:-all}" = targets ]; then
  step kernel_targets 540 python3 tools/kernel_targets.py --jobs 16 --out "$W/kernel_targets.json"
  exit
fi
PAIR=(--pairs qwen2-7b/qwen2-1.5b --models)
BATCHED=(--pair qwen2 --variant auto --batches 1 8 --static-batches 1 --slm-only-batches 1 --scale 0.25
         --skip-baselines --tag _i51)
step shapes_generic 110 python3 benchmarks/engine_shapes.py "${PAIR[@]}" --profile generic --out-dir "$W" --budget-s 100
step batched_generic 80 python3 benchmarks/engine_batched.py "${BATCHED[@]}" --profile generic --out-dir "$W" --budget-s 70
step shapes_native 100 python3 benchmarks/engine_shapes.py "${PAIR[@]}" --out-dir "$W" --budget-s 90
step batched_native 70 python3 benchmarks/engine_batched.py "${BATCHED[@]}" --out-dir "$W" --budget-s 60
step proof_cost 45 python3 benchmarks/proof_cost.py --out-dir "$W"
zoo_budget=$(( $(left) - 15 ))
step zoo $((zoo_budget + 10)) python3 benchmarks/zoo.py --device cuda --workers 8 --timeout 90 --budget "$zoo_budget" \
  ${ZOO_ONLY:+--only "$ZOO_ONLY"} --out "$W/zoo_$gpu"
python3 - "$W" <<'EOF'
import glob, json, sys
for path in sorted(glob.glob(sys.argv[1] + "/engine_shapes_*.json")):
    d = json.load(open(path))
    print(path.rsplit("/", 1)[1], [(r["model"], round(r.get("ms_per_token") or 0, 3), round(r.get("floor_ms") or 0, 3))
                                   for r in d.get("rows", [])])
for path in sorted(glob.glob(sys.argv[1] + "/zoo_*.json")):
    d = json.load(open(path))
    near = {k: v.get("auto_near") for k, v in d.get("architectures", {}).items() if v.get("auto_near")}
    print("zoo", d.get("counts"), "auto_near unequal:", sorted(k for k, v in near.items() if not v["equal"]),
          "of", len(near))
EOF
