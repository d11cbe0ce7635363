"""The "copy code" box: the ``generate(...)`` call that reproduces a run of the app, as a standalone script.

The script loads the pair as the app did (the shipped pair through ``hf_rstitch.shipped``), builds the same prompt
ids and calls ``llm.generate`` with the run's settings; its decoded output is the app's answer (a test runs it).
"""

from __future__ import annotations

from .run import SAMPLING, RunSettings


def _source(ref: str) -> str:
    """Python for a model reference: ``hf_rstitch.shipped("llm")`` for ``shipped:llm``, else the string."""
    if ref.startswith("shipped:"):
        return f'hf_rstitch.shipped("{ref.split(":", 1)[1]}")'
    return repr(ref)


def _load_args(pair) -> str:
    device = pair.device
    if device.type == "cpu":
        return ""
    dtype = next(pair.llm.parameters()).dtype
    return f", dtype={dtype}, device_map={str(device)!r}"


def reproduce(pair, settings: RunSettings) -> str:
    """The script, for ``pair`` (:class:`~hf_rstitch.ui.pair.Pair`) and the run's ``settings``."""
    load = _load_args(pair)
    chat = bool(getattr(pair.tokenizer, "chat_template", None))
    prompt = repr(settings.prompt.strip())
    inputs = (f'tok.apply_chat_template([{{"role": "user", "content": {prompt}}}], add_generation_prompt=True,\n'
              '                               return_tensors="pt", return_dict=True)' if chat
              else f'tok({prompt}, return_tensors="pt")')
    route = f"stitch_threshold={settings.threshold!r}"
    if settings.router and pair.router:
        route = f"stitch_router={pair.router!r}, " + route
    sampling = (", ".join(f"{k}={v!r}" for k, v in SAMPLING.items()) if settings.sample else "do_sample=False")
    seed = f"torch.manual_seed({settings.seed})\n" if settings.sample else ""
    return (
        "import torch\n"
        "from transformers import AutoModelForCausalLM, AutoTokenizer\n\n"
        "import hf_rstitch  # stitched decoding in generate()\n\n"
        f"llm = AutoModelForCausalLM.from_pretrained({_source(pair.llm_ref)}{load})\n"
        f"slm = AutoModelForCausalLM.from_pretrained({_source(pair.slm_ref)}{load})\n"
        f"tok = AutoTokenizer.from_pretrained({_source(pair.llm_ref)})\n"
        f"inputs = {inputs}.to(llm.device)\n"
        f"{seed}"
        f"out = llm.generate(**inputs, assistant_model=slm, {route},\n"
        f"                   max_new_tokens={settings.max_new_tokens}, {sampling}, return_dict_in_generate=True)\n"
        'print(tok.decode(out.sequences[0, inputs["input_ids"].shape[1]:], skip_special_tokens=True))\n'
        "print(out.stitch.summary())\n"
    )
