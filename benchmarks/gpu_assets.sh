#!/usr/bin/env bash
# The shipped GPU assets of this GPU kind made again from this checkout's kernels, then the first call measured
# with them, in one device call (tools/check_assets.py says when: after any change to fast/kernels/).
#
#   bash benchmarks/gpu_assets.sh              # one H200 (nvidia-h200), from the repository root
#   EXTRA=--dry-run-cpu bash benchmarks/gpu_assets.sh   # on a CPU: checks the script, builds nothing
#
# 1. tools/gemv_tuning_table.py: every candidate of every product shape timed (<= $TUNE_S s, default 230), the
#    table written under $OUT/gemv_tuning and put in the package here, so that
# 2. tools/triton_kernels_asset.py builds the kernels a fresh machine builds with that table (<= $KERNELS_S s,
#    default 190), the archive under $OUT/triton_kernels;
# 3. tools/check_assets.py against the new assets;
# 4. engine_shapes.py --fresh on Qwen2 7B / 1.5B: the first call in a fresh process with empty caches and the
#    new assets seeded (<= $SHAPES_S s, default 130; the three fit one 600 s call),
#    engine_shapes_<gpu>_assets.{json,md} under $OUT.
# Then here: copy $OUT/gemv_tuning/<gpu>.json to hf_rstitch/assets/gemv_tuning/ and $OUT/triton_kernels/<gpu>.*
# to hf_rstitch/assets/triton_kernels/, run make check-assets, commit them with the first call's result.
set -uo pipefail
OUT="${OUT:-/tmp/out}"
EXTRA="${EXTRA:-}"
mkdir -p "$OUT/gemv_tuning"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 PYTHONPATH="$PWD:$PWD/benchmarks${PYTHONPATH:+:$PYTHONPATH}"
t0=$SECONDS
python3 -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__,
"gpu", torch.cuda.get_device_name() if torch.cuda.is_available() else None)'
timeout -k 10 "${TUNE_S:-230}" python3 tools/gemv_tuning_table.py --table-dir "$OUT/gemv_tuning" --out-dir "$OUT" \
  $EXTRA 2>&1 | grep '^{' | tee "$OUT/tuning.log"  # a line a model (written after each: a cut-short run keeps them)
grep -q '"device"' "$OUT/tuning.log" || echo "WARNING: tuning cut short at ${TUNE_S:-230} s: the table lacks the" \
  "models after the last line above (a fresh machine times their shapes); raise TUNE_S or pass --models"
echo "tuning done at $((SECONDS - t0)) s"
for table in "$OUT"/gemv_tuning/*.json; do  # the package reads the new table from here on (not a dry run's)
  [ -f "$table" ] && [ -z "$EXTRA" ] && cp "$table" hf_rstitch/assets/gemv_tuning/
done
timeout -k 10 "${KERNELS_S:-190}" python3 tools/triton_kernels_asset.py --asset-dir "$OUT/triton_kernels" \
  --out-dir "$OUT/asset_copies" --budget-s "$(( ${KERNELS_S:-190} - 60 ))" $EXTRA 2>&1 | tail -2
echo "kernels done at $((SECONDS - t0)) s"
for part in "$OUT"/triton_kernels/*; do
  [ -f "$part" ] && [ -z "$EXTRA" ] && cp "$part" hf_rstitch/assets/triton_kernels/
done
rm -rf "$OUT/asset_copies"
python3 tools/check_assets.py
if [ -z "$EXTRA" ]; then
  mkdir -p "$OUT/shapes"
  timeout -k 10 "${SHAPES_S:-130}" python3 benchmarks/engine_shapes.py --out-dir "$OUT/shapes" --fresh --budget-s 110 \
    --scale 1.0 --pairs qwen2-7b/qwen2-1.5b --models --policies replay 2>&1 | grep "^|" | tail -4
  for f in "$OUT"/shapes/engine_shapes_*; do mv "$f" "$OUT/$(basename "${f%.*}")_assets.${f##*.}"; done
  rmdir "$OUT/shapes"
fi
echo "all done at $((SECONDS - t0)) s"
