"""Quickstart: one R-Stitch completion on the shipped toy pair, offline on a CPU.

    python examples/quickstart.py                      # LLM tokens shown in [brackets]
    python examples/quickstart.py --threshold 0.005    # a stricter tau: more LLM tokens

``examples/quickstart_hub.py`` is the same with the paper's 7B / 1.5B Hub pair.
"""

from __future__ import annotations

import argparse

import torch

import hf_rstitch  # noqa: F401  (registers stitched decoding on generate)
from common import TOY_PROBLEM, load_models, marked, prompt_ids
from hf_rstitch.hf.settings import DEFAULT_THRESHOLD


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--problem", default=TOY_PROBLEM)
    parser.add_argument("--threshold", type=float, default=DEFAULT_THRESHOLD, help="tau: normalized-entropy threshold")
    parser.add_argument("--max-new-tokens", type=int, default=300)
    args = parser.parse_args(argv)

    llm, slm, tok = load_models()
    ids = torch.tensor([prompt_ids(tok, args.problem)])
    out = llm.generate(ids, attention_mask=torch.ones_like(ids), assistant_model=slm,
                       stitch_threshold=args.threshold, max_new_tokens=args.max_new_tokens,
                       return_dict_in_generate=True)
    new = out.sequences[0, ids.shape[1]:].tolist()
    print(marked(tok, new, out.stitch.roles))
    summary = out.stitch.summary()
    print(summary)
    return summary


if __name__ == "__main__":
    main()
