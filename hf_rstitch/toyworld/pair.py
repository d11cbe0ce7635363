"""The shipped toy-world pair: load it, load its test split, grade its answers.

``load_pair()`` returns the LLM (verbose, accurate, slow) and the SLM (concise, weaker, fast)
trained by :mod:`hf_rstitch.toyworld.train`, in float32, with their shared tokenizer. Answers
are graded by the package's one grader, :mod:`hf_rstitch.eval.grading`, with its ``TOYWORLD``
profile (the last ``\\boxed{...}``, compared as an integer).
"""

from __future__ import annotations

from pathlib import Path

ASSETS = Path(__file__).resolve().parent.parent / "assets" / "pair"


def assets_present(root: str | Path = ASSETS) -> bool:
    root = Path(root)
    return all((root / role / "model.safetensors").exists() for role in ("llm", "slm")) and \
        (root / "test.jsonl").exists()


def extract_boxed(text: str) -> str | None:
    """Contents of the last ``\\boxed{...}`` in ``text``, stripped, or ``None``."""
    from hf_rstitch.eval.grading import last_boxed

    return last_boxed(text)


def grade(text: str, answer: str | int) -> bool:
    """True when the last ``\\boxed{}`` of ``text`` equals ``answer`` (the ``TOYWORLD`` profile)."""
    from hf_rstitch.eval.grading import TOYWORLD, grade as _grade

    return _grade(text, str(answer), TOYWORLD).correct


def _check(root: Path) -> None:
    if not assets_present(root):
        raise FileNotFoundError(
            f"toy-world pair not found under {root} (expected llm/, slm/ with model.safetensors and "
            "test.jsonl). Reinstall hf-rstitch from a full clone, or train one with "
            "`rstitch toyworld train --preset llm` / `--preset slm`.")


def load_model(role: str, device: str = "cpu", root: str | Path = ASSETS):
    """One model of the pair (``"llm"`` or ``"slm"``) in float32, in eval mode."""
    import torch
    from transformers import AutoModelForCausalLM

    if role not in ("llm", "slm"):
        raise ValueError(f"role must be 'llm' or 'slm', got {role!r}")
    model = AutoModelForCausalLM.from_pretrained(Path(root) / role, dtype=torch.float32)
    return model.to(device).eval()


def load_pair(device: str = "cpu", root: str | Path = ASSETS):
    """``(llm, slm, tokenizer)`` of the shipped pair, float32, on ``device`` (:func:`hf_rstitch.hf.loading.load_pair`).

    On the CPU it also picks torch's threads as the ``rstitch`` commands do (:func:`hf_rstitch.threads.apply_threads`:
    one for models this small, where more only add overhead, unless ``OMP_NUM_THREADS`` is set) and logs it."""
    import logging

    from ..hf.loading import load_pair as load
    from ..threads import apply_threads

    root = Path(root)
    _check(root)
    if str(device).startswith("cpu"):
        said = apply_threads([root / "llm", root / "slm"])
        if said:
            logging.getLogger(__name__).info("%s", said)
    return load(str(root / "llm"), str(root / "slm"), "float32", device)


def load_test_split(root: str | Path = ASSETS) -> list[dict]:
    """The held-out test problems: rows with ``id``, ``problem``, ``answer``, ``level``, ..."""
    from hf_rstitch.toyworld.tasks import read_jsonl

    path = Path(root) / "test.jsonl"
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing; regenerate it with "
                                "`rstitch toyworld data --split test --n 600 --out {path}`")
    return read_jsonl(path)
