#!/usr/bin/env bash
# Second training stage of the shipped toy-world LLM, on one CUDA GPU: continue the stage-1 model
# (benchmarks/train_pair.sh, 20 % concise rows) with half of its rows in the concise style, so it
# stays verbose when it answers alone (the opening word is learned from verbose rows only) but is
# as accurate inside the SLM's concise traces, where stitched decoding hands it positions.
# Usage: OUT=out_dir bash benchmarks/continue_llm.sh [STAGE1_DIR] [MINUTES]
set -euo pipefail
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
OUT=${OUT:-runs/toyworld}
STAGE1=${1:-hf_rstitch/assets/pair/llm}
MINUTES=${2:-7.5}
WORK=${WORK:-/tmp/toyworld_pair}
mkdir -p "$OUT" "$WORK"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader || true
python -m hf_rstitch.cli.main toyworld train --preset llm --init-from "$STAGE1" \
    --other-style-fraction 0.5 --lr 5e-4 --warmup-steps 100 --out "$WORK/llm_stage2" --device cuda \
    --max-minutes "$MINUTES" --workers 12 --eval-every 1000 --n-valid 500 2>&1 | tee "$OUT/llm_stage2.log"
# Files come back from the device in pieces of at most 16 MiB: cat llm_stage2.tgz.part* | tar xz
tar czf - -C "$WORK" llm_stage2 | split -b 15M -d - "$OUT/llm_stage2.tgz.part"
ls -la "$OUT"
