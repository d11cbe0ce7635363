"""Tuner choices on L2-warm against L2-cold weights (one-off, issue 39): two gemv_candidates runs of tools/gemv_tuning_table.py
(HF_RSTITCH_TUNE_L2=warm, =cold) compared: the warm choice's cold time against the cold choice's.

    python benchmarks/l2_tuning_compare.py <warm run dir> <cold run dir>
"""
import json, sys, glob
def load(d):
    f = glob.glob(f"{d}/gemv_candidates_*.json")[0]
    doc = json.load(open(f))
    return {(m, t.get("kind"), t["n"], t["k"], t["rows"]): t for m, v in doc["models"].items() for t in v["tunings"]}
w, c = load(sys.argv[1]), load(sys.argv[2])
tot = {}
print("model kind NxK rows | warm-chosen: warm us, cold us | cold-chosen: cold us | gain")
for key, tw in w.items():
    tc = c.get(key)
    if tc is None or key[4] != 1:
        continue
    ch_w, ch_c = tw["chosen"], tc["chosen"]
    wu = tw["ms"].get(ch_w, float("nan")) * 1e3
    cw = tc["ms"].get(ch_w, float("nan")) * 1e3
    cc = tc["ms"].get(ch_c, float("nan")) * 1e3
    m = key[0]
    a, b = tot.get(m, (0.0, 0.0))
    tot[m] = (a + cw, b + cc)
    print(f"{m} {key[1]} {key[2]}x{key[3]} | {ch_w.replace('GemvConfig','')[:60]} {wu:.2f} {cw:.2f} | {ch_c.replace('GemvConfig','')[:60]} {cc:.2f} | {cw/cc:.2f}x")
for m, (a, b) in tot.items():
    print(f"TOTAL one of each shape {m}: warm-chosen {a:.1f} us cold, cold-chosen {b:.1f} us")
