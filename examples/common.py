"""What every example shares: which pair to load and how to prompt it.

The shipped toy pair (offline, CPU, the default) or the paper's kind of Hub pair (``--hub``):
DeepSeek-R1-Distill-Qwen-7B as the LLM with DeepSeek-R1-Distill-Qwen-1.5B as the SLM (same
tokenizer; a GPU with ~20 GB for both in bfloat16).
"""

from __future__ import annotations

import os
import sys

from hf_rstitch.toyworld.tasks import example_row

HUB_LLM = "deepseek-ai/DeepSeek-R1-Distill-Qwen-7B"
HUB_SLM = "deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B"
TOY_PROBLEM = example_row()["problem"]  # a held-out problem, the one `rstitch generate` asks by default


def hub_available() -> bool:
    """False when the Hub is switched off (HF_HUB_OFFLINE=1, as in the tests)."""
    return os.environ.get("HF_HUB_OFFLINE", "0").lower() not in ("1", "true", "yes")


def load_models(hub: bool = False, device: str | None = None):
    """``(llm, slm, tokenizer)``: the shipped pair in float32, or the Hub pair in bfloat16."""
    import torch

    if not hub:
        from hf_rstitch import shipped
        from hf_rstitch.threads import apply_threads
        from hf_rstitch.toyworld import load_pair

        said = apply_threads([shipped("llm"), shipped("slm")])  # 1 thread for this tiny pair unless OMP_NUM_THREADS is set
        if said:
            print(said, file=sys.stderr)
        return load_pair(device or "cpu")
    if not hub_available():
        raise SystemExit("--hub needs the Hugging Face Hub, but HF_HUB_OFFLINE is set; drop --hub for the shipped pair.")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from hf_rstitch.sources import check_hub_source

    for flag, model in (("LLM", HUB_LLM), ("SLM", HUB_SLM)):
        check_hub_source(model, flag)  # one line at once (cache, or one short request), not a minute of retries
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    llm = AutoModelForCausalLM.from_pretrained(HUB_LLM, dtype=dtype).to(device).eval()
    slm = AutoModelForCausalLM.from_pretrained(HUB_SLM, dtype=dtype).to(device).eval()
    return llm, slm, AutoTokenizer.from_pretrained(HUB_LLM)


def prompt_ids(tok, problem: str, hub: bool = False) -> list[int]:
    """Chat-template prompt ids; the Hub pair gets the paper's boxed-answer instruction, the toy pair none."""
    from hf_rstitch.eval.data import DEFAULT_INSTRUCTION, prompt_ids as ids

    return ids(tok, problem, instruction=DEFAULT_INSTRUCTION if hub else "")


def marked(tok, ids: list[int], roles) -> str:
    """The completion with LLM-written tokens in [brackets]."""
    return "".join(f"[{tok.decode([t])}]" if str(r) == "llm" else tok.decode([t]) for t, r in zip(ids, roles))
