"""Write README.md model cards for the shipped toy-world pair from the measured numbers.

Reads ``benchmarks/results/toyworld_pair.json`` (CPU, benchmarks/measure_pair.py), the GPU
measurement made right after training (``--gpu-metrics``, optional) and each folder's
``training_summary.json``, so every number in a card comes from a file.

    python benchmarks/write_model_cards.py --gpu-metrics benchmarks/results/toyworld_pair_cuda.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
STITCHED = "## Stitched with its partner"
PAIR = REPO / "hf_rstitch" / "assets" / "pair"

TRAIN_COMMANDS = {
    "llm": ("python -m hf_rstitch.cli.main toyworld train --preset llm --out $WORK/llm --device cuda "
            "--max-minutes 6.5 --workers 6 --eval-every 1000"),
    "llm_stage2": "bash benchmarks/continue_llm.sh $WORK/llm 7.6",
    "slm": ("python -m hf_rstitch.cli.main toyworld train --preset slm --out $WORK/slm --device cuda "
            "--max-minutes 1.5 --workers 8 --eval-every 100 --n-valid 500 --max-valid-accuracy 0.68"),
}
TRAIN_NOTES = {
    "llm": " It shared the GPU with an SLM training run that was not kept (its checkpoint cap was "
           "0.72, too close to the 0.75 target).",
    "slm": "",
}
ROLE_TEXT = {
    "llm": ("the *LLM* of the toy world: slow, accurate, verbose (the role of DeepSeek-R1-Distill "
            "in the R-Stitch paper)"),
    "slm": ("the *SLM* of the toy world: fast, weaker, concise (the role of L1-1.5B-Short in the "
            "R-Stitch paper)"),
}


def _stage2(summary: dict) -> list[str]:
    """Card lines of a second training stage (a summary with ``stage1``), or nothing."""
    if "stage1" not in summary:
        return []
    cfg, sel = summary["config"], summary["selected"]
    return [
        "",
        f"**Stage 2.** `{TRAIN_COMMANDS['llm_stage2']}`: the stage-1 model above, trained on with "
        f"{cfg['other_style_fraction']:.0%} of its rows in the other style (still not learning that "
        "style's opening word, so it still opens verbose when it answers alone), on "
        f"{summary['device']} (one NVIDIA H100). Why: stitched decoding hands the LLM positions "
        "*inside the SLM's concise traces*; the stage-1 model solved only 92.8 % of 600 valid problems "
        "when made to answer concisely (`benchmarks/results/toyworld_opened_concise.json`), so R-Stitch at thresholds that keep traces concise could not "
        "be more accurate than that. AdamW, peak LR "
        f"{cfg['lr']}, {cfg['warmup_steps']} warm-up steps, cosine over {cfg['max_minutes']} minutes: "
        f"{summary['steps']} steps, {summary['seconds']:.0f} s. Checkpoints are scored on the sum of "
        "valid accuracy answering alone and answering with the other style's opening word given "
        f"(`eval_other_style`). Selected: step {sel['step']}, valid accuracy {sel['accuracy']:.3f}, "
        f"opened concise {sel['other_accuracy']:.3f} ({cfg['n_valid']} valid problems, greedy).",
    ]


def card(role: str, cpu: dict, gpu: dict | None, summary: dict) -> str:
    stage2 = _stage2(summary)
    summary = summary.get("stage1", summary)
    cfg, sel = summary["config"], summary["selected"]
    m = cpu[role]
    other = "concise" if cfg["own_style"] == "verbose" else "verbose"
    lines = [
        f"# hf-rstitch toy-world {role.upper()}",
        "",
        f"A {cfg['arch'].capitalize()} causal LM ({summary['params']:,} parameters; {cfg['num_layers']} "
        f"layers, hidden {cfg['hidden_size']}, {cfg['num_heads']} heads, MLP {cfg['intermediate_size']}), "
        f"{ROLE_TEXT[role]}. Weights are stored in float16 safetensors; `config.json` asks for "
        "float32, which is how it is meant to run (`AutoModelForCausalLM.from_pretrained(folder)`, "
        "or `hf_rstitch.toyworld.load_pair()`).",
        "",
        "## Data",
        "Multi-step arithmetic word problems from `hf_rstitch/toyworld/tasks.py` (2-4 steps of +, -, "
        "x digit, / digit; values up to 999; levels 1-3), generated on the fly from seed "
        f"{cfg['seed']}, train split only (the split is a hash of each problem's numbers and "
        "operations, so no test arithmetic is seen in training). Chat-formatted with the shared "
        "tokenizer's template; loss on the assistant part only.",
        f"Style mix: {1 - cfg['other_style_fraction']:.0%} `{cfg['own_style']}` (its own style), "
        f"{cfg['other_style_fraction']:.0%} `{other}`; on the other style's rows the style's opening "
        "token is left out of the loss, so the model opens in its own style but can continue either.",
        "",
        "## Training",
        f"`{TRAIN_COMMANDS[role]}` on {summary['device']} (one NVIDIA H200; see "
        "`benchmarks/train_pair.sh`). AdamW, peak LR "
        f"{cfg['lr']}, batch {cfg['batch_size']}, bf16 autocast, cosine schedule over "
        f"{cfg['max_minutes']} minutes of wall time: {summary['steps']} steps, "
        f"{summary['seconds']:.0f} s." + TRAIN_NOTES[role],
        f"Selected checkpoint: step {sel['step']}, valid accuracy {sel['accuracy']:.3f} "
        f"({cfg['n_valid']} valid problems, greedy)."
        + (" (Stage 1.)" if stage2 else "")
        + (f" The SLM is meant to be the weaker model: the selected checkpoint is the best whose "
           f"valid accuracy is at most {cfg['max_valid_accuracy']} (later checkpoints of the same "
           "run reached over 0.98)." if cfg["max_valid_accuracy"] else ""),
        *stage2,
        "",
        "## Measured (held-out test split, greedy, plain `model.generate`)",
        f"- test split: `hf_rstitch/assets/pair/test.jsonl`, {cpu['n_problems']} problems",
        f"- accuracy {m['accuracy']:.3f} (by level: "
        + ", ".join(f"{k}: {v:.3f}" for k, v in m["accuracy_by_level"].items()) + ")",
        f"- mean answer length {m['mean_tokens']:.1f} tokens (EOS included); SLM/LLM length ratio "
        f"{cpu['length_ratio_slm_over_llm']:.3f}",
    ]
    if "ms_per_token_batch1" in m:
        lines.append(f"- {m['ms_per_token_batch1']:.2f} ms per token at batch 1; LLM/SLM per-token "
                     f"time ratio {cpu['speed_ratio_llm_over_slm']:.2f}")
    versions = ", ".join(f"{k} {v}" for k, v in cpu["versions"].items())
    lines += [f"- device: {cpu['device']}; {versions}; {cpu['date']}",
              f"- command: `{cpu['command']}`"]
    if gpu:
        lines.append(f"- also on {gpu['device']} right after training: accuracy "
                     f"{gpu[role]['accuracy']:.3f}, mean length {gpu[role]['mean_tokens']:.1f} tokens "
                     f"(`{gpu['command']}`)")
    lines += ["", "Full numbers: `benchmarks/results/toyworld_pair.json`.", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cpu-metrics", default=str(REPO / "benchmarks" / "results" / "toyworld_pair.json"))
    p.add_argument("--gpu-metrics", default="")
    args = p.parse_args(argv)
    cpu = json.loads(Path(args.cpu_metrics).read_text())
    gpu = json.loads(Path(args.gpu_metrics).read_text()) if args.gpu_metrics else None
    for role in ("llm", "slm"):
        summary = json.loads((PAIR / role / "training_summary.json").read_text())
        path = PAIR / role / "README.md"
        # sections added after the pair's own measurements (e.g. stitched results) are kept
        extra = path.read_text().partition(STITCHED)[2] if path.exists() else ""
        path.write_text(card(role, cpu, gpu, summary) + (f"\n{STITCHED}{extra}" if extra else ""))
        print(f"wrote {PAIR / role / 'README.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
