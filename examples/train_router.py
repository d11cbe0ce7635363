"""R-Stitch+ at small scale: train a router on the shipped pair for a few DAPO steps, then decode with it.

    python examples/train_router.py                                  # ~1-2 minutes on a CPU
    python examples/train_router.py --steps 50 --batch-prompts 32 --group-size 8 --device cuda

Uses the shipped router's latency profile (``hf_rstitch.shipped("latency")``) for the
reward's latency term, so nothing is profiled here. A few steps do not make a good router -- the
shipped one took 53 steps of 32 prompts x 8 rollouts on a GPU (docs/router.md) -- this shows the
loop, the files it writes and how the result is used. ``rstitch train-router`` is the full CLI.
"""

from __future__ import annotations

import argparse

import torch

import hf_rstitch  # noqa: F401  (registers stitched decoding on generate)
from common import TOY_PROBLEM, load_models, marked, prompt_ids
from hf_rstitch.router.config import RouterTrainConfig
from hf_rstitch.training.router import train_router

SHIPPED_PROFILE = hf_rstitch.shipped("latency")


def main(argv: list[str] | None = None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--batch-prompts", type=int, default=4)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=200)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--out", default="runs/router-small")
    args = parser.parse_args(argv)

    llm, slm, tok = load_models(device=args.device)
    cfg = RouterTrainConfig(
        out=args.out, steps=args.steps, batch_prompts=args.batch_prompts, group_size=args.group_size,
        n_train=max(64, args.steps * args.batch_prompts), max_new_tokens=args.max_new_tokens, device=args.device,
        latency_profile=str(SHIPPED_PROFILE) if SHIPPED_PROFILE.exists() else "auto",
        lam=3.36e-4, llm_bias=2.0, lr=2e-3, resume=False,  # the shipped router's reward weight and init
    )
    router = train_router(cfg, llm=llm, slm=slm, tokenizer=tok, log=lambda line: print(line, flush=True))
    print(f"router: {sum(p.numel() for p in router.parameters()):,} parameters, saved to {args.out}/router")

    ids = torch.tensor([prompt_ids(tok, TOY_PROBLEM)], device=llm.device)
    out = llm.generate(ids, attention_mask=torch.ones_like(ids), assistant_model=slm,
                       stitch_router=f"{args.out}/router", max_new_tokens=args.max_new_tokens,
                       return_dict_in_generate=True)
    print(marked(tok, out.sequences[0, ids.shape[1]:].tolist(), out.stitch.roles))
    print(out.stitch.summary())
    return router


if __name__ == "__main__":
    main()
