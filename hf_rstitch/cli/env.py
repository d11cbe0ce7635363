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


def run(args: argparse.Namespace) -> int:
    info = collect()
    if args.json:
        import json

        print(json.dumps(info))
    else:
        print("\n".join(f"- {k}: {v}" for k, v in info.items()))
    return 0
