"""Plain greedy ``model.generate`` over toy-world problems: accuracy and answer length.

This is the single-model baseline used to select checkpoints while training and to measure the
shipped pair; it knows nothing about stitching. Batches are left-padded, so on a GPU a whole
split is solved in a few batched calls.
"""

from __future__ import annotations

import time
from typing import Callable

from hf_rstitch.toyworld.pair import grade
from hf_rstitch.toyworld.tokenizer import prompt_text


def generate_batch(model, tokenizer, problems: list[str], max_new_tokens: int = 400,
                   opener: str = ""):
    """Greedy completions for ``problems``: (texts, number of generated tokens incl. EOS each).

    ``opener`` is written at the start of every answer (e.g. ``"So"`` to make a model answer in
    the concise style); it is part of the prompt, not of the returned text or length."""
    import torch

    prompts = [prompt_text(tokenizer, p) + opener for p in problems]
    enc = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    enc = {k: v.to(model.device) for k, v in enc.items()}
    with torch.inference_mode():
        out = model.generate(**enc, max_new_tokens=max_new_tokens, do_sample=False,
                             eos_token_id=tokenizer.eos_token_id,
                             pad_token_id=tokenizer.pad_token_id)
    new = out[:, enc["input_ids"].shape[1]:]  # [B, T_new]
    texts, lengths = [], []
    for row in new.tolist():
        n = row.index(tokenizer.eos_token_id) + 1 if tokenizer.eos_token_id in row else len(row)
        lengths.append(n)
        texts.append(tokenizer.decode(row[:n], skip_special_tokens=True))
    return texts, lengths


def evaluate(model, tokenizer, rows: list[dict], batch_size: int = 128,
             max_new_tokens: int = 400, progress: Callable[[int, int], None] | None = None,
             opener: str = "") -> dict:
    """Accuracy, mean generated length and per-row results of greedy decoding on ``rows``
    (answers opened with ``opener`` when given: see :func:`generate_batch`)."""
    results, t0 = [], time.perf_counter()
    for start in range(0, len(rows), batch_size):
        chunk = rows[start:start + batch_size]
        texts, lengths = generate_batch(model, tokenizer, [r["problem"] for r in chunk],
                                        max_new_tokens, opener)
        for row, text, n in zip(chunk, texts, lengths):
            results.append({"id": row["id"], "correct": grade(text, row["answer"]), "tokens": n,
                            "text": text})
        if progress:
            progress(len(results), len(rows))
    n = max(len(results), 1)
    return {
        "n": len(results),
        "accuracy": sum(r["correct"] for r in results) / n,
        "mean_tokens": sum(r["tokens"] for r in results) / n,
        "seconds": time.perf_counter() - t0,
        "results": results,
    }
