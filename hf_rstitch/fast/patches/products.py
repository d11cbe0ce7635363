"""Which kernels a lane's linear layers and MLPs run: the tuned Triton GEMV and gated-MLP kernels, or cuBLAS.

A lane asks once, when it is built (:func:`product_layers`); the answer is a list of (module, forward)
pairs that :func:`hf_rstitch.fast.patches.linears.gemv_linears_on` installs around each of the lane's forwards.
Tuning results are shared by every lane of the process (:data:`TABLE`, keyed by shape and device), so
a second lane of the same shapes -- the other model's, a one-row twin, a new batch size -- tunes only
what it has not seen; and kept on disk for later processes on the same machine
(:mod:`hf_rstitch.fast.kernels.tuning_cache`).
"""

from __future__ import annotations

import torch

from . import fold_tuning, gated_mlp, linears, regions
from ..kernels import gemv, triton_support
from ..config import FastConfig
from ..kernels.tuning_cache import TuningTable

TABLE = TuningTable()  # tuned configurations, shared by every lane of the process and kept on disk


def kernels_run(model: torch.nn.Module, config: FastConfig) -> bool:
    """Whether the lane's products run the Triton kernels: ``config.gemv`` not False and Triton on the model's
    device (``gemv=True`` without it is an error)."""
    if config.gemv is False:
        return False
    if not gemv.available(model.device):
        if config.gemv:
            raise ValueError(f"FastConfig(gemv=True) needs Triton and a CUDA device (got {model.device}); "
                             "install triton or leave gemv=None.")
        return False
    return True


def pending(model: torch.nn.Module, config: FastConfig, max_rows: int) -> list:
    """The tuning jobs :func:`product_layers` will time (shapes not in :data:`TABLE`), and the choices it holds
    (this machine's earlier tuning, or a shipped table), as ``(candidates, run)`` for
    :func:`~hf_rstitch.fast.kernels.triton_support.precompile` to build all their kernels at once beforehand."""
    if not kernels_run(model, config):
        return []
    jobs = []
    for held in (False, True):
        jobs += linears.pending(model, TABLE, config.fuse_qkv, max_rows, held)
        jobs += gated_mlp.pending(model, TABLE, max_rows, held) if config.fuse_mlp else []
    return jobs


def product_layers(model: torch.nn.Module, config: FastConfig, max_rows: int) -> list:
    """(module, forward) pairs for ``model``'s one-token and catch-up products in a lane of ``max_rows`` rows:
    the fused q/k/v and other linears (``config.gemv``, ``fuse_qkv``) and the gated MLPs (``fuse_mlp``).
    Empty where Triton does not run on the model's device (cuBLAS everywhere); ``gemv=True`` there is an
    error."""
    if not kernels_run(model, config):
        return []
    layers = linears.plan(model, TABLE, fuse=config.fuse_qkv, max_rows=max_rows)  # the wide tier only for lanes that need it
    if config.fuse_mlp:  # MLP forwards: installed with the linears' (gemv_linears_on), before the regions'
        act_mul = regions.silu_mul() if config.compile == "parts" else None
        layers += gated_mlp.plan(model, TABLE, act_mul, max_rows=max_rows)
    if config.compile == "parts" and config.adds_with_norms:  # the layers fold at one row: their own kernels,
        layers = fold_tuning.retune(model, layers, TABLE)  # tuned as they run
        triton_support.precompile(fold_jobs(model, layers), model.device)
    return layers


def fold_jobs(model: torch.nn.Module, products) -> list[tuple]:
    """``(candidates, run)`` for :func:`~hf_rstitch.fast.kernels.triton_support.precompile`: the folded one-row products
    (a norm before, an add after: kernels of their own) of each foldable layer shape, with the configurations
    the lane runs them with (``products``: the lane's installed (module, forward) pairs), built at once rather than
    one by one at the first capture. Inputs stand in as empty tensors."""
    installed, jobs, seen = dict(products), [], set()
    for kind, target, weights, fold in fold_tuning.folded(model, installed):
        cfg = fold_tuning.one_row_config(target, installed)
        key = (kind, tuple(weights[0].shape), cfg)
        if key not in seen:
            seen.add(key)
            jobs.append(((cfg,), fold_tuning.launch_for(kind, weights, fold)))
    return jobs
