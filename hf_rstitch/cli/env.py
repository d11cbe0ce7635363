"""``rstitch env``: the versions and settings to paste into a bug report (like ``transformers env``)."""

from __future__ import annotations

import argparse
import os
import platform
import sys

NAME = "env"
HELP = "print hf-rstitch's environment (versions, devices, settings) for bug reports"
DESCRIPTION = HELP + "; paste its output into an issue."

PACKAGES = ("torch", "transformers", "accelerate", "huggingface-hub", "tokenizers", "safetensors",
            "math-verify", "matplotlib", "datasets", "fastapi", "uvicorn", "ray", "triton")
SETTINGS = ("OMP_NUM_THREADS", "HF_HUB_OFFLINE", "HF_HOME", "HF_RSTITCH_ENGINE", "CUDA_VISIBLE_DEVICES")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="one JSON object instead of the list")
    parser.add_argument("--plan", nargs="?", const="shipped", default=None, metavar="MODEL", help=(
        "also print which fused kernel the fast engine's lane runs for each module of MODEL, or why the model's "
        "own code runs (FastLane.plan, stitch_engine='auto''s configuration): a Hub id, a model folder, a pair "
        "folder holding llm/ and slm/, or shipped:NAME; without MODEL, the shipped pair"))
    parser.add_argument("--device", default="auto", help="the device of --plan: auto (cuda if available), cuda, cpu")
    parser.add_argument("--dtype", default="auto", help=(
        "the dtype --plan loads MODEL in: auto (bfloat16 on CUDA, float32 elsewhere), float32, bfloat16, float16; "
        "the shipped pair is float32"))


def _version(package: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(package)
    except PackageNotFoundError:
        return "not installed"


def collect() -> dict[str, str]:
    """Everything ``rstitch env`` reports, as strings."""
    import hf_rstitch
    from ..toyworld.pair import assets_present

    info = {"hf-rstitch": f"{hf_rstitch.__version__} ({os.path.dirname(hf_rstitch.__file__)})",
            "shipped pair": "present" if assets_present() else "missing (install from a clone or its wheel)",
            "platform": platform.platform(), "python": sys.version.split()[0]}
    info.update({name: _version(name) for name in PACKAGES})
    if info["torch"] != "not installed":
        import torch

        cuda = torch.cuda.is_available()
        info["torch CUDA"] = (f"{torch.version.cuda}, {torch.cuda.device_count()} x {torch.cuda.get_device_name(0)}"
                              if cuda else "not available")
        info["torch CPU threads"] = f"{torch.get_num_threads()} (of {os.cpu_count()} cores)"
    info.update({name: os.environ.get(name, "(unset)") for name in SETTINGS})
    return info


def fast_plans(device: str = "auto", model: str = "shipped", dtype: str = "auto") -> dict:
    """``{name: FastPlan}``: the lanes ``stitch_engine="auto"`` would build on ``device`` (one row each;
    :mod:`hf_rstitch.fast.plan`) for ``model``: ``"shipped"`` (the shipped pair: ``"llm"`` and ``"slm"``), a pair
    folder holding ``llm/`` and ``slm/`` (both), or one model (a Hub id, a folder or ``shipped:NAME``, in
    ``dtype``). Loads the models, builds no lane; the plan runs its probes."""
    from pathlib import Path

    from ..fast import AUTO, plan_for
    from ..hf.loading import resolve_device
    from ..resources import resolve

    device = resolve_device(device)
    if model == "shipped":
        from ..toyworld.pair import load_pair

        llm, slm, _ = load_pair(device)
        return {"llm": plan_for(llm, AUTO), "slm": plan_for(slm, AUTO)}
    source = resolve(model)
    pair = Path(source)
    if all((pair / role / "config.json").is_file() for role in ("llm", "slm")):
        return {role: plan_for(_load(str(pair / role), dtype, device), AUTO) for role in ("llm", "slm")}
    return {model: plan_for(_load(source, dtype, device), AUTO)}


def _load(source: str, dtype: str, device: str):
    """One causal LM from a folder or a Hub id, in ``dtype`` on ``device``, in eval mode."""
    from pathlib import Path

    from transformers import AutoModelForCausalLM

    from ..hf.loading import resolve_dtype
    from ..sources import check_hub_source, check_local_source, looks_local

    if looks_local(source) or Path(source).exists():
        check_local_source(source, "--plan")
    else:
        check_hub_source(source, "--plan")
    torch_dtype = resolve_dtype(dtype, device)
    return AutoModelForCausalLM.from_pretrained(source, dtype=torch_dtype).to(device).eval()


def run(args: argparse.Namespace) -> int:
    info = collect()
    plans = fast_plans(args.device, args.plan, args.dtype) if args.plan else {}
    if args.json:
        import json

        print(json.dumps({**info, **{f"fast plan {name}": _as_json(plan) for name, plan in plans.items()}}))
    else:
        print("\n".join(f"- {k}: {v}" for k, v in info.items()))
        for name, plan in plans.items():
            print(f"\n{name.upper() if name in ('llm', 'slm') else name}: {plan}")
    return 0


def _as_json(plan) -> dict:
    """The plan's fields, each module line as an object."""
    return {**plan.as_dict(), "modules": [choice._asdict() for choice in plan.modules]}
