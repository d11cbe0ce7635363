"""Multi-GPU stitched decoding (issue #10): equality and per-token latency, 1 GPU vs device_map.

Random-weight Qwen2 7B (LLM) and 1.5B (SLM) in bf16. Their entropies mean nothing, so every
stitched run replays one drawn route (ReplayPolicy, about 30% LLM tokens); greedy decoding.

1. One GPU (the pair on ``--devices[0]``): the reference stitched output, the LLM's
   teacher-forced argmax over that output, and per-token latency of LLM-only and stitched decoding.
2. device_map over ``--devices`` (the LLM's layers split evenly, embeddings on the first device,
   the SLM on the first device too): the same output and latencies.
3. Saves both checkpoints and the reference (``--save-dir``) for ``--tp-worker``: one process per GPU under
   ``torchrun --nproc-per-node 2``, every rank loads the LLM the way a user would (``from_pretrained`` with
   ``DistributedConfig(tp_plan="auto")``, transformers' tensor-parallel plan) and its own whole SLM, runs the
   same stitched generate on the same prompt and route; rank 0 checks that all ranks produced the same tokens,
   compares them with the 1-GPU reference, times both and adds a ``tensor-parallel`` row to the table.

"Equal" means token-for-token equal greedy output. Where an output differs, the first differing
step and the reference's top-2 logit margin there are reported: a split model reduces sums in
another order, so a near-tie can break the other way (device_map does not change any sum).

    python benchmarks/multigpu_bench.py --out benchmarks/results --save-dir /tmp/mg
    torchrun --nproc-per-node 2 benchmarks/multigpu_bench.py --tp-worker --out benchmarks/results --save-dir /tmp/mg
    python benchmarks/multigpu_bench.py --shape tiny --devices cpu cpu --new-tokens 32 --llm-share 0.5 \\
        --out /tmp/o --save-dir /tmp/mg  # CPU smoke run
"""

from __future__ import annotations

import argparse
import datetime
import json
import re
import statistics
import sys
import time
from pathlib import Path

import torch
import transformers

import hf_rstitch
from hf_rstitch.hf.placement import check_placement, describe

from lab import random_pair, share_route, sync

TOP = 5  # logits kept per step for the divergence report


DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}


def gpu_slug(devices, dtype: str = "bfloat16") -> str:
    """e.g. ``nvidia-h100-80gb-hbm3_x2`` (``cpu_x2`` for the smoke run); ``..._float32`` for a float32 run."""
    d = torch.device(devices[0])
    name = torch.cuda.get_device_name(d) if d.type == "cuda" else "cpu"
    suffix = "" if dtype == "bfloat16" else f"_{dtype}"
    return f"{re.sub(r'[^a-z0-9]+', '-', name.lower()).strip('-')}_x{len(devices)}{suffix}"


def meta(devices, args) -> dict:
    names = [torch.cuda.get_device_name(torch.device(d)) if torch.device(d).type == "cuda" else "cpu" for d in devices]
    return {"gpus": names, "torch": torch.__version__, "transformers": transformers.__version__,
            "date": datetime.date.today().isoformat(), "shape": args.shape, "prompt_len": args.prompt_len,
            "new_tokens": args.new_tokens, "llm_share": args.llm_share, "repeats": args.repeats, "dtype": args.dtype}


def build_pair(shape: str, device: str, dtype: torch.dtype = torch.bfloat16):
    """(llm, slm), seeded, on ``device`` (the tiny LLM has 4 layers: 2 per device of the smoke run)."""
    return random_pair(shape, device, dtype, tiny_layers=4)


def split_map(llm, devices) -> dict[str, int | str]:
    """Layers split evenly over ``devices``; embeddings first, norm and head last (what "auto" does).
    GPUs are named by index, as in the maps ``from_pretrained(device_map="auto")`` builds."""
    devices = [torch.device(d).index if torch.device(d).type == "cuda" else str(d) for d in devices]
    n, k = len(llm.model.layers), len(devices)
    dmap = {"model.embed_tokens": devices[0], "model.rotary_emb": devices[0], "model.norm": devices[-1],
            "lm_head": devices[-1]}
    dmap.update({f"model.layers.{i}": devices[i * k // n] for i in range(n)})
    return dmap


def request(vocab: int, args) -> tuple[torch.Tensor, list[str]]:
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(10, vocab - 10, (1, args.prompt_len), generator=g)
    return ids, share_route(args.new_tokens, args.llm_share, 4.0, seed=0)


def gen_kwargs(n: int) -> dict:
    return dict(max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=0, eos_token_id=0)


def stitched(llm, slm, ids, route, n, **kw):
    return llm.generate(ids, assistant_model=slm, stitch_policy=hf_rstitch.ReplayPolicy(route), stitch_engine="default",
                        **gen_kwargs(n), **kw)  # eager on one GPU too: device_map runs only the eager lanes


def reference_run(llm, slm, ids, route, n) -> dict:
    """Greedy stitched output with the top logits of every step."""
    out = stitched(llm, slm, ids, route, n, return_dict_in_generate=True, output_logits=True)
    top = [s[0].float().topk(TOP) for s in out.logits]
    return {"sequence": out.sequences[0].tolist(), "roles": [str(r) for r in out.stitch.roles],
            "top_values": [t.values.tolist() for t in top], "top_ids": [t.indices.tolist() for t in top]}


@torch.no_grad()
def forced_logits(llm, sequence: list[int], prompt_len: int) -> torch.Tensor:
    """The LLM alone over ``sequence``: float32 logits ``[new, V]`` at every generated position."""
    ids = torch.tensor([sequence], device=llm.device)
    return llm(input_ids=ids).logits[0, prompt_len - 1: -1].float()


def teacher_forced(llm, sequence: list[int], prompt_len: int) -> dict:
    """The LLM alone over the reference sequence: argmax and top-2 margin at every generated position."""
    top = forced_logits(llm, sequence, prompt_len).topk(2)
    return {"argmax": top.indices[:, 0].tolist(), "margin": (top.values[:, 0] - top.values[:, 1]).tolist()}


def compare(run: dict, forced: dict, ref: dict) -> dict:
    """Equality of a run with the reference, and where and how narrowly it first differs."""
    seq, want = run["sequence"], ref["run"]["sequence"]
    start = len(want) - len(ref["run"]["top_ids"])
    first = next((i for i, (a, b) in enumerate(zip(seq[start:], want[start:])) if a != b), None)
    report = {"equal": seq == want, "first_diff_step": first, "roles_equal": run["roles"] == ref["run"]["roles"]}
    if first is not None:
        values = ref["run"]["top_values"][first]
        report.update(ref_margin_at_diff=values[0] - values[1], ours=seq[start + first], ref=want[start + first],
                      ours_in_ref_top=seq[start + first] in ref["run"]["top_ids"][first])
    flips = [i for i, (a, b) in enumerate(zip(forced["argmax"], ref["forced"]["argmax"])) if a != b]
    report["forced_argmax_flips"] = len(flips)
    report["forced_flip_max_ref_margin"] = max((ref["forced"]["margin"][i] for i in flips), default=None)
    report["forced_median_ref_margin"] = statistics.median(ref["forced"]["margin"])
    return report


def ms_per_token(fn, devices, n: int, repeats: int, barrier=None) -> float:
    """Median wall milliseconds per new token over ``repeats`` timed calls after one warm-up."""
    fn()
    times = []
    for _ in range(repeats):
        sync(*devices)
        if barrier:
            barrier()
        t0 = time.perf_counter()
        fn()
        sync(*devices)
        times.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(times) / n


def measure(mode: str, llm, slm, ids, route, devices, args, ref: dict | None, barrier=None) -> dict:
    """One layout: placement check, equality with the reference (if given), latencies."""
    n = args.new_tokens
    check_placement(llm, slm, ids)
    run = reference_run(llm, slm, ids, route, n)
    # teacher-forced over the reference's tokens: once a run has diverged, its own tokens are other inputs
    forced = teacher_forced(llm, (ref or {"run": run})["run"]["sequence"], ids.shape[1])
    row = {"mode": mode, "llm": describe(llm), "slm": describe(slm)}
    if ref is not None:
        row["equality"] = compare(run, forced, ref)
    row["llm_only_ms_per_token"] = ms_per_token(lambda: llm.generate(ids, **gen_kwargs(n)), devices, n,
                                                args.repeats, barrier)
    row["stitched_ms_per_token"] = ms_per_token(lambda: stitched(llm, slm, ids, route, n), devices, n,
                                                args.repeats, barrier)
    print(f"{mode:12s} llm-only {row['llm_only_ms_per_token']:7.2f} ms/tok  stitched "
          f"{row['stitched_ms_per_token']:7.2f} ms/tok  {row.get('equality', {}).get('equal', 'reference')}",
          file=sys.stderr, flush=True)
    return row, {"run": run, "forced": forced}


def markdown(result: dict) -> str:
    m = result["meta"]
    lines = [
        "# Multi-GPU stitched decoding: equality and per-token latency\n",
        f"GPUs: {', '.join(m['gpus'])}; torch {m['torch']}, transformers {m['transformers']}; {m['date']}. "
        f"Random-weight Qwen2 {'7B + 1.5B' if m['shape'] == 'qwen2' else m['shape']} in {m.get('dtype', 'bfloat16')}, batch 1, prompt "
        f"{m['prompt_len']} tokens, {m['new_tokens']} new tokens, greedy; stitched runs replay one drawn route "
        f"({m['route_llm_tokens']} LLM tokens, {m['route_switches']} switches). Median of {m['repeats']} runs after "
        "a warm-up; eager DynamicCache lanes. The SLM sits whole on the first GPU (device_map) or on every rank's GPU (TP).\n",
        "| mode | LLM placement | LLM-only ms/token | stitched ms/token | stitched output = 1 GPU | "
        "teacher-forced argmax flips |",
        "| --- | --- | ---: | ---: | --- | ---: |",
    ]
    for r in result["rows"]:
        eq = r.get("equality")
        if eq is None:
            same, flips = "(reference)", "-"
        else:
            same = "yes" if eq["equal"] else (f"no: first differs at step {eq['first_diff_step']} "
                                              f"(ref top-2 margin {eq['ref_margin_at_diff']:.4g})")
            flips = f"{eq['forced_argmax_flips']}/{m['new_tokens']}"
        if r.get("ranks_agree") is not None:
            same += "; all ranks agree" if r["ranks_agree"] else "; RANKS DISAGREE"
        lines.append(f"| {r['mode']} | {r['llm']} | {r['llm_only_ms_per_token']:.2f} | "
                     f"{r['stitched_ms_per_token']:.2f} | {same} | {flips} |")
    lines.append("\nTeacher-forced flips: positions of the 1-GPU stitched output where the LLM alone, fed that "
                 "output, picks another argmax than on 1 GPU (median 1-GPU top-2 margin: "
                 f"{result['rows'][0].get('forced_median_margin', float('nan')):.4g}).")
    return "\n".join(lines) + "\n"


def write(result: dict, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    stem = out / f"multigpu_{result['slug']}"
    stem.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")
    stem.with_suffix(".md").write_text(markdown(result))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", default="qwen2", choices=["qwen2", "tiny"],
                    help="qwen2: random 7B LLM + 1.5B SLM; tiny: in-process toy pair (smoke test)")
    ap.add_argument("--devices", nargs="+", default=["cuda:0", "cuda:1"],
                    help="the device_map spreads the LLM over these; the 1-GPU run uses the first")
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--llm-share", type=float, default=0.3, help="share of LLM tokens in the replayed route")
    ap.add_argument("--repeats", type=int, default=None, help="default 3; --tp-worker: as the 1-GPU run")
    ap.add_argument("--dtype", default="bfloat16", choices=sorted(DTYPES),
                    help="float32: equality with the 1-GPU run holds up to far smaller rounding (TP sums in another order)")
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"))
    ap.add_argument("--save-dir", default=None, help="save the pair and the reference here for --tp-worker; "
                                                     "with --tp-worker, where they were saved")
    ap.add_argument("--tp-worker", action="store_true", help="a tensor-parallel rank under torchrun (step 3)")
    args = ap.parse_args(argv)
    if args.tp_worker:
        return tp_worker(Path(args.save_dir), Path(args.out), args.repeats)
    args.repeats = args.repeats or 3
    devices = args.devices
    llm, slm = build_pair(args.shape, devices[0], DTYPES[args.dtype])
    ids, route = request(min(llm.config.vocab_size, slm.config.vocab_size), args)
    ids = ids.to(devices[0])
    rows = []
    row, ref = measure("1 GPU", llm, slm, ids, route, devices[:1], args, None)
    row["forced_median_margin"] = statistics.median(ref["forced"]["margin"])
    rows.append(row)
    if args.save_dir:
        t0 = time.perf_counter()
        save = Path(args.save_dir)
        llm.save_pretrained(save / "llm")
        slm.save_pretrained(save / "slm")
        (save / "reference.json").write_text(json.dumps({"ids": ids.tolist(), "route": route, "dtype": args.dtype, **ref}))
        print(f"saved the pair in {time.perf_counter() - t0:.1f}s", file=sys.stderr, flush=True)
    from accelerate import dispatch_model

    # as from_pretrained(device_map=...) does it; force_hooks only matters for the CPU smoke run
    llm = dispatch_model(llm, split_map(llm, devices), skip_keys=llm._skip_keys_device_placement, force_hooks=True)
    row, _ = measure(f"device_map x{len(devices)}", llm, slm, ids, route, devices, args, ref)
    rows.append(row)
    facts = {"route_llm_tokens": route.count("llm"), "route_switches": sum(a != b for a, b in zip(route, route[1:]))}
    result = {"meta": {**meta(devices, args), **facts}, "slug": gpu_slug(devices, args.dtype), "rows": rows}
    write(result, Path(args.out))
    print(markdown(result))
    print(json.dumps({"slug": result["slug"], "rows": rows}))
    return 0


def load_tp(path: Path, dtype: torch.dtype = torch.bfloat16):
    from transformers import AutoModelForCausalLM

    try:
        from transformers.distributed import DistributedConfig

        return AutoModelForCausalLM.from_pretrained(path, dtype=dtype, distributed_config=DistributedConfig(tp_plan="auto"))
    except ImportError:  # transformers without DistributedConfig (tp_plan was a from_pretrained argument)
        return AutoModelForCausalLM.from_pretrained(path, dtype=dtype, tp_plan="auto")


def same_on_all_ranks(values: list[int], device) -> bool:
    import torch.distributed as dist

    t = torch.tensor(values, device=device)
    both = torch.stack([t, -t])
    dist.all_reduce(both, op=dist.ReduceOp.MAX)
    return bool(torch.equal(both[0], -both[1]))


def tp_worker(save: Path, out: Path, repeats: int | None) -> int:
    """``--tp-worker``: this rank's part of step 3 (``repeats``: default, as the 1-GPU run)."""
    import os

    import torch.distributed as dist
    from transformers import AutoModelForCausalLM

    local_rank = int(os.environ["LOCAL_RANK"])
    device = torch.device("cuda", local_rank) if torch.cuda.is_available() else torch.device("cpu")
    ref = json.loads((save / "reference.json").read_text())
    dtype = ref.get("dtype", "bfloat16")
    llm = load_tp(save / "llm", DTYPES[dtype]).eval()
    slm = AutoModelForCausalLM.from_pretrained(save / "slm", dtype=DTYPES[dtype], device_map={"": device}).eval()
    world = dist.get_world_size()
    slug = gpu_slug([str(device)] * world, dtype)
    result = json.loads((out / f"multigpu_{slug}.json").read_text())
    m = result["meta"]
    run_args = argparse.Namespace(new_tokens=m["new_tokens"], repeats=repeats or m["repeats"])
    ids = torch.tensor(ref["ids"], device=device)
    torch.manual_seed(0)  # greedy here; a sampled run would need the same seed on every rank
    row, mine = measure(f"tensor-parallel x{world}", llm, slm, ids, ref["route"], [device], run_args, ref,
                        barrier=dist.barrier)
    row["ranks_agree"] = same_on_all_ranks(mine["run"]["sequence"], device)
    if dist.get_rank() == 0:
        result["rows"] = [r for r in result["rows"] if not r["mode"].startswith("tensor-parallel")] + [row]
        write(result, out)
        print(markdown(result))
        print(json.dumps({"slug": slug, "tp_row": row}))
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
