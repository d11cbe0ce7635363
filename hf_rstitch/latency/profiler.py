"""Time a causal LM's forward calls over an (N_inf, N_kv) grid and fit Eq. 4 to the medians.

For each cache size N_kv the profiler prefills a :class:`~transformers.DynamicCache` with N_kv
random token ids once, then for each N_inf times a forward of N_inf random ids on that cache
and crops the cache back (``cache.crop(-n_inf)``). Every cell gets ``warmup`` untimed calls
and ``repeats`` timed ones; the median is kept. Times are host wall-clock around the call with
the device synchronised on both sides, i.e. they include Python and kernel-launch overhead,
which is what a batch-1 stitched decode pays.

It knows nothing about stitching: it measures one model. Fitting and prediction live in the
torch-free :mod:`hf_rstitch.latency.model`.
"""

from __future__ import annotations

import datetime
import logging
import platform
import statistics
import time
from typing import Any, Callable, Sequence

import torch

from ..hf.compat import with_cache
from .model import Coefficients, LatencyProfileError, ModelProfile, fit, fit_decode, grid_is_fittable

logger = logging.getLogger(__name__)

DEFAULT_N_INF = (1, 4, 16, 64, 256, 1024, 2048)
DEFAULT_N_KV = (0, 512, 1024, 2048, 4096, 8192)

# Shapes of the paper's pair (DeepSeek-R1-Distill-Qwen-1.5B / -7B are Qwen2 architectures).
QWEN2_SHAPES: dict[str, dict[str, int]] = {
    "1.5b": dict(hidden_size=1536, num_hidden_layers=28, num_attention_heads=12, num_key_value_heads=2,
                 intermediate_size=8960, vocab_size=151936),
    "7b": dict(hidden_size=3584, num_hidden_layers=28, num_attention_heads=28, num_key_value_heads=4,
               intermediate_size=18944, vocab_size=152064),
}


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()
    elif device.type == "xpu":
        torch.xpu.synchronize(device)


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"{device.type} ({platform.processor() or platform.machine()})"


def random_qwen2(size: str, dtype: torch.dtype = torch.bfloat16, device: str | torch.device = "cuda",
                 seed: int = 0) -> torch.nn.Module:
    """A random-weight Qwen2 causal LM of the 1.5B or 7B shape, built directly on ``device``."""
    from transformers import AutoModelForCausalLM, Qwen2Config

    if size not in QWEN2_SHAPES:
        raise ValueError(f"unknown Qwen2 size {size!r}; expected one of {sorted(QWEN2_SHAPES)}.")
    cfg = Qwen2Config(**QWEN2_SHAPES[size], max_position_embeddings=32768, rope_theta=1e6,
                      tie_word_embeddings=size == "1.5b")
    cfg._name_or_path = f"random-qwen2-{size}"
    torch.manual_seed(seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(cfg, dtype=dtype)
    return model.eval()


def model_facts(model: torch.nn.Module, name: str | None = None) -> dict[str, Any]:
    cfg = model.config
    facts: dict[str, Any] = {"name": name or getattr(cfg, "_name_or_path", "") or type(model).__name__}
    for key in ("model_type", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                "intermediate_size", "vocab_size"):
        facts[key] = getattr(cfg, key, None)
    facts["attn_implementation"] = getattr(cfg, "_attn_implementation", None)
    facts["parameters"] = sum(p.numel() for p in model.parameters())
    return facts


def _forward(model, ids: torch.Tensor, cache, logits_to_keep: int) -> None:
    # ids: [1, N_inf]; the cache grows by N_inf
    model(input_ids=ids, **with_cache(model, cache), use_cache=True, logits_to_keep=logits_to_keep)


def _prefill(model, n_kv: int, vocab: int, device, logits_to_keep: int, chunk: int = 4096):
    from transformers import DynamicCache

    cache = DynamicCache(config=model.config)
    for start in range(0, n_kv, chunk):  # chunked so the activations of a long prefill stay small
        ids = torch.randint(0, vocab, (1, min(chunk, n_kv - start)), device=device)
        _forward(model, ids, cache, logits_to_keep)
    return cache


def time_cell(model, cache, n_inf: int, vocab: int, device: torch.device, repeats: int, warmup: int,
              logits_to_keep: int = 1) -> list[float]:
    """Milliseconds of ``warmup + repeats`` forwards of ``n_inf`` tokens on ``cache`` (timed ones only).

    The cache is cropped back after each call, so every call sees the same N_kv.
    """
    samples = []
    for i in range(warmup + repeats):
        ids = torch.randint(0, vocab, (1, n_inf), device=device)
        synchronize(device)
        t0 = time.perf_counter()
        _forward(model, ids, cache, logits_to_keep)
        synchronize(device)
        t1 = time.perf_counter()
        cache.crop(-n_inf)
        if i >= warmup:
            samples.append((t1 - t0) * 1e3)
    return samples


def _log_progress(done: int, total: int, n_inf: int, n_kv: int, ms: float) -> None:
    logger.info("[%*d/%d] n_kv=%-6d n_inf=%-5d %9.3f ms", len(str(total)), done, total, n_kv, n_inf, ms)


@torch.inference_mode()
def profile_model(
    model: torch.nn.Module,
    n_inf: Sequence[int] = DEFAULT_N_INF,
    n_kv: Sequence[int] = DEFAULT_N_KV,
    repeats: int = 3,
    warmup: int = 2,
    logits_to_keep: int = 1,
    name: str | None = None,
    seed: int = 0,
    progress: bool | Callable[[int, int, int, int, float], None] = True,
    relative_fit: bool = False,
) -> ModelProfile:
    """Time ``model`` over the grid ``n_inf x n_kv`` and fit Eq. 4 (and the N_inf = 1 reference fit).

    Args:
        model: a transformers causal LM, already on its device and in its dtype.
        n_inf: tokens per timed forward call (>= 1).
        n_kv: cache sizes before the call (>= 0).
        repeats: timed calls per cell; the median is kept.
        warmup: untimed calls per cell before the timed ones.
        logits_to_keep: positions the LM head is computed for (1 = last only, as generation does;
            0 = all).
        progress: log a counter at INFO on ``hf_rstitch.latency.profiler`` (True; ``rstitch profile`` shows it), stay quiet (False), or a callback
            ``(done, total, n_inf, n_kv, median_ms)``.
        relative_fit: weight residuals by 1 / ms (:func:`~hf_rstitch.latency.model.fit`), so a grid
            that spans long prefills still fits the short decode steps a trajectory is made of.

    Returns:
        A :class:`ModelProfile`; ``.to_dict()`` is the JSON profile.
    """
    n_inf, n_kv = _checked_grid(n_inf, n_kv, repeats, warmup)
    device = next(model.parameters()).device
    torch.manual_seed(seed)
    model.eval()
    t_start = time.perf_counter()
    report = progress if callable(progress) else (_log_progress if progress else None)
    grid = _time_grid(model, n_inf, n_kv, repeats, warmup, logits_to_keep, report)
    points = [(g["n_inf"], g["n_kv"], g["median_ms"]) for g in grid]
    full = fit(points, relative=relative_fit)
    decode = fit_decode(points) if len(n_kv) >= 2 and n_inf[0] == 1 else None
    meta = _meta(model, device, repeats, warmup, logits_to_keep, time.perf_counter() - t_start)
    meta["fit_residuals"] = "relative (1/ms weights)" if relative_fit else "absolute (plain least squares, as the paper)"
    return ModelProfile(fit=full, decode_fit=decode, model=model_facts(model, name), grid=grid, meta=meta)


def _checked_grid(n_inf: Sequence[int], n_kv: Sequence[int], repeats: int, warmup: int) -> tuple[list, list]:
    """The grid's axes sorted and deduplicated, or :class:`LatencyProfileError` saying why Eq. 4 cannot be fit."""
    n_inf = sorted({int(x) for x in n_inf})
    n_kv = sorted({int(x) for x in n_kv})
    if not n_inf or not n_kv:
        raise LatencyProfileError("empty grid: give at least one N_inf and one N_kv value.")
    if n_inf[0] < 1 or n_kv[0] < 0 or repeats < 1 or warmup < 0:
        raise LatencyProfileError("the grid needs N_inf >= 1, N_kv >= 0, repeats >= 1 and warmup >= 0.")
    if not grid_is_fittable(n_inf, n_kv):
        raise LatencyProfileError(
            f"grid N_inf={n_inf} x N_kv={n_kv} cannot determine Eq. 4's four coefficients; use at least 3 distinct "
            "N_inf values (one > 1) and 2 distinct N_kv values."
        )
    return n_inf, n_kv


def _time_grid(model, n_inf: list[int], n_kv: list[int], repeats: int, warmup: int, logits_to_keep: int,
               report: Callable | None) -> list[dict]:
    """Per cell ``(n_inf, n_kv)``: the median and the samples of ``repeats`` timed calls (ms), after one
    throwaway pass so CUDA context, cuBLAS handles and kernel selection stay out of the first cell."""
    device, vocab = next(model.parameters()).device, model.config.vocab_size
    time_cell(model, _prefill(model, min(n_kv[-1], 64), vocab, device, logits_to_keep), min(n_inf[-1], 64), vocab,
              device, repeats=0, warmup=2, logits_to_keep=logits_to_keep)
    grid, total = [], len(n_inf) * len(n_kv)
    for kv in n_kv:
        cache = _prefill(model, kv, vocab, device, logits_to_keep)
        for ni in n_inf:
            samples = time_cell(model, cache, ni, vocab, device, repeats, warmup, logits_to_keep)
            grid.append({"n_inf": ni, "n_kv": kv, "median_ms": statistics.median(samples), "samples_ms": samples})
            if report:
                report(len(grid), total, ni, kv, grid[-1]["median_ms"])
        del cache
    return grid


def _meta(model, device: torch.device, repeats: int, warmup: int, logits_to_keep: int, seconds: float) -> dict:
    import transformers

    return {
        "device": device_name(device),
        "device_type": device.type,
        "dtype": str(next(model.parameters()).dtype).removeprefix("torch."),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "timing": {"repeats": repeats, "warmup": warmup, "statistic": "median", "logits_to_keep": logits_to_keep,
                   "clock": "host perf_counter, device synchronised before and after each call",
                   "profile_seconds": round(seconds, 2)},
    }


def fit_summary(profile: ModelProfile) -> str:
    """One human line per fit, for the CLI and benchmarks."""
    def line(tag: str, c: Coefficients | None) -> str:
        if c is None:
            return f"{tag}: -"
        return f"{tag}: a={c.a:.6g} b={c.b:.6g} c={c.c:.6g} d={c.d:.6g} ms  R^2={c.r2:.4f} (n={c.n_points})"
    return "\n".join([line("Eq. 4 fit ", profile.fit), line("decode fit", profile.decode_fit)])
