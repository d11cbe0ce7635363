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
SETTINGS = ("OMP_NUM_THREADS", "HF_HUB_OFFLINE", "HF_HOME", "HF_RSTITCH_ENGINE", "HF_RSTITCH_PROVE", "HF_RSTITCH_PROFILE",
            "CUDA_VISIBLE_DEVICES")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="one JSON object instead of the list")
    parser.add_argument("--plan", action="store_true", help=(
        "also print which kernels and patches the fast engine's lanes run (stitch_engine='auto''s configuration) "
        "for the shipped pair on --device: FastLane.plan"))
    parser.add_argument("--device", default="auto", help="the device of --plan: auto (cuda if available), cuda, cpu")


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
    if info["torch"] != "not installed":
        info.update(proofs())
    return info


def proofs() -> dict[str, str]:
    """The fast engine's proofs stored on this machine (:mod:`hf_rstitch.fast.proof`), one line each."""
    from ..fast import proof_store

    where = proof_store.folder()
    stored = proof_store.entries()
    if not stored:
        return {"fast engine proofs": f"none stored ({where or 'memory only: HF_RSTITCH_PROOFS=off'})"}
    return {f"fast engine proof {i + 1}": proof_store.describe(record) for i, record in enumerate(stored)}


def fast_plans(device: str = "auto") -> dict:
    """``{"llm": FastPlan, "slm": FastPlan}``: the lanes ``stitch_engine="auto"`` would build for the shipped pair
    on ``device`` (one row each; :mod:`hf_rstitch.fast.plan`). Loads the pair, builds no lane."""
    from ..hf.loading import resolve_device
    from ..fast import AUTO, plan_for
    from ..toyworld.pair import load_pair

    llm, slm, _ = load_pair(resolve_device(device))
    return {"llm": plan_for(llm, AUTO), "slm": plan_for(slm, AUTO)}


def run(args: argparse.Namespace) -> int:
    info = collect()
    plans = fast_plans(args.device) if args.plan else {}
    if args.json:
        import json

        print(json.dumps({**info, **{f"fast plan {role}": plan.as_dict() for role, plan in plans.items()}}))
    else:
        print("\n".join(f"- {k}: {v}" for k, v in info.items()))
        for role, plan in plans.items():
            print(f"\n{role.upper()} {plan}")
    return 0
