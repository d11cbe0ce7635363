"""Where the request engine's host waits for the device inside a step, by call site (CUDA only).

    PYTHONPATH=$PWD:$PWD/benchmarks python benchmarks/host_syncs.py --out-dir $OUT

Runs the request engine as ``rstitch serve`` builds it (the fast engine, paged KV) on a small random pair in a
closed loop -- rows finishing, leaving and joining every few steps; requests pinned to the LLM (``llm_only``), the
entropy rule (``stitched``), and ``serve_reasoning.py``'s replayed routes with decisions on the device (``replayed``)
-- under torch's sync debug mode ("warn"), and
counts every synchronizing call by its innermost ``hf_rstitch`` frame (and the request-engine frame above it). A
synchronizing call inside a step makes the host wait for every kernel queued before it, a lane call run ahead
included, so the device then idles while the host finishes the step. The reads the design allows -- a step's values
and the SLM's hand-over decisions, page-locked copies waited for on an event -- are event waits, not counted.
Torch's sync debug mode does not see every synchronizing call (its warning says so), so zero here is a floor.
Writes ``host_syncs_<gpu>.{json,md}``.
"""

from __future__ import annotations

import argparse
import collections
import sys
import traceback
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import lab  # noqa: E402

PKG = str(Path(__file__).resolve().parent.parent / "hf_rstitch")


def _site(stack) -> str:
    """The innermost hf_rstitch frame of ``stack``, and the request-engine frame that called into it."""
    ours = [f for f in stack if f.filename.startswith(PKG)]
    if not ours:
        return "outside hf_rstitch"
    inner = ours[-1]
    outer = next((f for f in reversed(ours) if "/batching/" in f.filename), None)
    where = f"{Path(inner.filename).relative_to(Path(PKG).parent)}:{inner.lineno} {inner.name}"
    return where if outer is None or outer is inner else f"{where} <- {Path(outer.filename).name}:{outer.name}"


def run(method: str, clients: int, steps: int, warm: int, max_batch: int) -> dict:
    from hf_rstitch.batching.requests import Request, RequestEngine
    from hf_rstitch.core.roles import Role
    from lab import tiny_qwen2

    llm, slm = tiny_qwen2(256, 4, 0, "cuda", torch.bfloat16, vocab=1024), tiny_qwen2(128, 2, 1, "cuda", torch.bfloat16, vocab=1024)
    for m in (llm, slm):
        m.generation_config.eos_token_id = None
    policy = None
    if method == "replayed":  # serve_reasoning.py's stand-in policy: replayed routes, decisions on the device
        import serve_reasoning

        policy = serve_reasoning.replay_policy(max_batch, 0.31, llm.device)
    eng = RequestEngine.of(llm, slm, max_batch=max_batch, threshold=0.55, engine="auto", max_length=192,
                           policy=policy)
    gen = torch.Generator().manual_seed(0)
    k = 0

    def submit():
        nonlocal k
        n = int(torch.randint(4, 24, (1,), generator=gen))
        eng.submit(Request(torch.randint(3, 1000, (n,), generator=gen).tolist(), eos_token_id=[],
                           max_new_tokens=int(torch.randint(8, 48, (1,), generator=gen)),
                           role=Role.LLM if method == "llm_only" else None, request_id=f"q{k}"))
        k += 1

    for _ in range(clients):
        submit()
    sites: collections.Counter = collections.Counter()
    counting = False

    def show(message, category, filename, lineno, file=None, line=None):
        if counting and "synchronizing" in str(message):
            sites[_site(traceback.extract_stack()[:-1])] += 1

    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            warnings.showwarning = show
            for s in range(warm + steps):
                counting = s >= warm
                for e in eng.step():
                    if e.finished:
                        submit()
    finally:
        torch.cuda.set_sync_debug_mode("default")  # catch_warnings puts showwarning back
    return {"method": method, "clients": clients, "max_batch": max_batch, "steps": steps,
            "syncs_per_step": sum(sites.values()) / steps, "sites": dict(sites.most_common()),
            "stats": dict(eng.stats)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out-dir", type=Path, required=True)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--warm", type=int, default=60, help="steps before counting (graphs captured, join twins built)")
    ap.add_argument("--clients", type=int, default=24)
    ap.add_argument("--max-batch", type=int, default=16)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("host_syncs.py needs CUDA: torch's sync debug mode watches CUDA calls")
    rows = [run(m, args.clients, args.steps, args.warm, args.max_batch) for m in ("llm_only", "stitched", "replayed")]
    doc = {**lab.environment(["cuda"]), "rows": rows}
    device = doc["devices"][0]
    lines = [f"# Synchronizing calls inside the request engine's steps: {device}", "",
             f"torch {doc['torch']}, transformers {doc['transformers']}, {doc['date']}. A small random Qwen2 pair, the "
             f"fast engine with paged KV, {args.clients} clients in a closed loop over {args.max_batch} rows, "
             f"{args.steps} steps counted after {args.warm}; torch's sync debug mode (a floor: it does not see every "
             "synchronizing call).", "", "| method | syncs a step | site | count |", "|---|---|---|---|"]
    for r in rows:
        for site, n in r["sites"].items():
            lines.append(f"| {r['method']} | {r['syncs_per_step']:.2f} | `{site}` | {n} |")
        if not r["sites"]:
            lines.append(f"| {r['method']} | 0.00 | none | 0 |")
    lab.write_result(args.out_dir / f"host_syncs_{lab.file_tag('cuda')}", doc, "\n".join(lines))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
