#!/usr/bin/env bash
# Train the toy-world pair on one CUDA GPU (both models at once), measure it on the test split,
# and pack it. Usage: OUT=out_dir bash benchmarks/train_pair.sh [LLM_MINUTES] [SLM_MINUTES]
# The shipped pair: LLM 6.5 min (run alongside a discarded 4-min SLM run) and SLM 1.5 min, on one
# H200 (see the model cards). The schedule follows wall time, so other GPUs give other step counts.
set -euo pipefail
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
OUT=${OUT:-runs/toyworld}
LLM_MIN=${1:-6.5}
SLM_MIN=${2:-1.5}
WORK=${WORK:-/tmp/toyworld_pair}
mkdir -p "$OUT" "$WORK"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader || true
python -m hf_rstitch.cli.main toyworld data --split test --n 600 --out "$WORK/test.jsonl"
python -m hf_rstitch.cli.main toyworld train --preset llm --out "$WORK/llm" --device cuda \
    --max-minutes "$LLM_MIN" --workers 6 --eval-every 1000 2>&1 | tee "$OUT/llm.log" &
python -m hf_rstitch.cli.main toyworld train --preset slm --out "$WORK/slm" --device cuda \
    --max-minutes "$SLM_MIN" --workers 4 --eval-every 100 --n-valid 500 2>&1 | tee "$OUT/slm.log" &
wait %1 %2
python benchmarks/measure_pair.py --llm "$WORK/llm" --slm "$WORK/slm" --data "$WORK/test.jsonl" \
    --device cuda --batch-size 300 --no-speed --out "$OUT/metrics_cuda.json"
# Files come back from the device in pieces of at most 16 MiB: cat pair.tgz.part* | tar xz
tar czf - -C "$WORK" llm slm test.jsonl | split -b 15M -d - "$OUT/pair.tgz.part"
ls -la "$OUT"
