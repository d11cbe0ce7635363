#!/usr/bin/env bash
# Ray Serve replicas on GPUs in one device call (issue #38 item 5): installs the Ray bundle carried in .ray
# (tools/ray_bundle.py), then runs serve_replicas.py through serve_reasoning.py --replicas and prints its table
# last. Results under $OUT: serve_replicas_<gpu>.{json,md}, install.log, run.log, ray_logs/ (tails, on failure).
#
#   bash benchmarks/serve_replicas_gpu.sh          # two GPUs (nvidia-h100-x2): 1 vs 2 replicas + kill test, ~200 s
#   bash benchmarks/serve_replicas_gpu.sh smoke    # one GPU: install, Ray, one small replica, <= 120 s
# Run from the repository root (or a copy of it in a folder of the checkout) with .ray carried. On CPU, to check the script itself:
#   SITE=/tmp/site311 EXTRA=--dry-run-cpu bash benchmarks/serve_replicas_gpu.sh smoke   (.ray built for --python 3.11)
set -uo pipefail
OUT="${OUT:-/tmp/out}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
t0=$SECONDS
python3 -c 'import grpc, google.protobuf as p; print("image: grpc", grpc.__version__, "protobuf", p.__version__)' 2>&1 | tail -1
SITE="${SITE:-/tmp/site}"
bundle="${RAY_BUNDLE:-}"  # .ray here, or in a folder above (a copy of this tree inside another checkout)
for d in .ray ../.ray ../../.ray ../../../.ray; do
  [ -z "$bundle" ] && [ -f "$d/install.sh" ] && bundle="$d"
done
if [ -z "$bundle" ] || ! bash "$bundle/install.sh" "$SITE" >"$OUT/install.log" 2>&1; then
  tail -30 "$OUT/install.log" 2>/dev/null; echo "FAILED: no Ray bundle installed from '${bundle:-.ray}' (carry .ray)"; exit 1
fi
export PYTHONPATH="$PWD:$SITE${PYTHONPATH:+:$PYTHONPATH}"
echo "installed $bundle in $((SECONDS - t0)) s: $(tail -1 "$OUT/install.log")"
python3 -c 'import torch, grpc, google.protobuf as p; print("torch", torch.__version__, "gpus", torch.cuda.device_count(), "grpc", grpc.__version__, "protobuf", p.__version__)'
if [ "${1:-full}" = smoke ]; then
  args=(--replicas 1 --no-kill --scale 0.05 --max-batch 8 --replica-concurrency 16 --warmup-s 2 --window-s 4)
  limit=100
else
  # 128 clients, one load for both counts: 2 x 64 rows for two replicas; one replica holds 64 and Ray queues 64 (at 160
  # its queue overflows into 429s and the one-replica row measures backpressure, not a replica: measured, 2x H200).
  # 500 writes a second through Ray's proxy for both counts (2 replicas: 250 each): every chunk crosses three
  # processes (engine replica, front, proxy), each paying Ray's per-item cost
  args=(--replicas 1 2 --scale 0.05 --max-batch 64 --replica-concurrency 128 --warmup-s 4 --window-s 12
        --stream-writes-per-s 500 --replace-timeout-s 100)
  limit=$((470 - (SECONDS - t0)))
fi
timeout -k 10 "$limit" python3 benchmarks/serve_reasoning.py "${args[@]}" ${EXTRA:-} --out-dir "$OUT" 2>&1 | tee "$OUT/run.log" | \
  grep -E "^\[|Error|error|Traceback" | cut -c1-600
rc=${PIPESTATUS[0]}
if [ "$rc" != 0 ]; then  # what Ray's processes said: the raylet, GCS, Serve's controller, proxy and replicas
  mkdir -p "$OUT/ray_logs"
  for f in /tmp/ray/session_latest/logs/{raylet.out,raylet.err,gcs_server.err,runtime_env_agent.log} \
           /tmp/ray/session_latest/logs/serve/*.log /tmp/ray/session_latest/logs/worker-*.err; do
    [ -f "$f" ] && tail -200 "$f" >"$OUT/ray_logs/$(basename "$f")"
  done
  tail -40 "$OUT/run.log"
fi
timeout 30 python3 -m ray.scripts.scripts stop --force >/dev/null 2>&1  # whatever Ray left running after a time-out
echo "rc $rc after $((SECONDS - t0)) s"
cat "$OUT"/serve_replicas_*.md 2>/dev/null
exit "$rc"
