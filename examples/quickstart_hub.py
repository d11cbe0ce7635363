"""Quickstart with Hub models: DeepSeek-R1-Distill-Qwen-7B (LLM) + DeepSeek-R1-Distill-Qwen-1.5B (SLM).

    python examples/quickstart_hub.py                              # downloads ~18 GB; a GPU is advised
    python examples/quickstart_hub.py --threshold 0.03 --max-new-tokens 2048

Not run by the tests (they are offline); with HF_HUB_OFFLINE=1 it explains itself and exits, and where the Hub
cannot be reached it says so in one line.
"""

from __future__ import annotations

import argparse
import sys

import torch

import hf_rstitch  # noqa: F401  (registers stitched decoding on generate)
from common import hub_available, load_models, marked, prompt_ids
from hf_rstitch.hf.settings import DEFAULT_THRESHOLD


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--problem", default="What is 17 * 23?")
    parser.add_argument("--threshold", type=float, default=DEFAULT_THRESHOLD, help="tau (the paper uses 0.02 - 0.03)")
    parser.add_argument("--max-new-tokens", type=int, default=4096)
    args = parser.parse_args(argv)
    if not hub_available():
        print("skipped: this example downloads models from the Hub and HF_HUB_OFFLINE is set; "
              "run examples/quickstart.py for the offline version.")
        return 0

    try:
        llm, slm, tok = load_models(hub=True)
    except OSError as err:  # the Hub unreachable, or the models not found: say so in one line
        print(f"quickstart_hub: error: {err}", file=sys.stderr)
        return 2
    ids = torch.tensor([prompt_ids(tok, args.problem, hub=True)], device=llm.device)
    out = llm.generate(ids, attention_mask=torch.ones_like(ids), assistant_model=slm,
                       stitch_threshold=args.threshold, max_new_tokens=args.max_new_tokens,
                       return_dict_in_generate=True)
    print(marked(tok, out.sequences[0, ids.shape[1]:].tolist(), out.stitch.roles))
    print(out.stitch.summary())
    return 0


if __name__ == "__main__":
    sys.exit(main())
