"""Which kernels and patches a :class:`~hf_rstitch.fast.lane.FastLane` runs: one object, decided once.

:func:`plan_for` reads a :class:`~hf_rstitch.fast.config.FastConfig`, the model (its configuration, device,
dtype and head size) and the lane's rows, and answers every choice the lane makes when it is built: graphs
and buckets, compile mode, attention kernel, the products' kernels and tiers, the norms and adds, the
rotary embedding, the windows, the experts' dispatch, the read-out. The lane builds what the plan names and
nothing else. ``print(lane.plan)`` (or ``print(plan_for(llm, AUTO))`` before any lane exists, or
``rstitch env --plan``) shows it, one line per choice::

    FastLane plan for Qwen2ForCausalLM (cuda:0, torch.bfloat16, up to 1 rows)
      graphs       CUDA graphs; batch buckets 1; length buckets 1, 2, 4, 8, 16, 32, 64, 128
      attention    split (Triton, written slots only; steps build no mask)
      ...

Per module (the ``module`` lines, :mod:`~hf_rstitch.fast.module_plan`): which fused kernel runs in a norm's, a decoder
layer's or a router's place, or why the model's own code runs -- decided by a probe on random inputs
(:mod:`~hf_rstitch.fast.probes`), never by the module's source text::

      module       Qwen2RMSNorm x57 (norm): rms_norm kernel: probe equal (max abs err 0)
      module       MyRMSNorm x5 (norm): model's own code: probe differs (max abs err 0.88)

Three choices are only candidates here, settled when the lane is built because they need the model's
weights or a run: the products keep cuBLAS for a shape and tier where it timed faster (the tuner), a layer
folds only where :func:`~hf_rstitch.fast.patches.folds.foldable` approves it, and the rotation is deferred to
the cache's store only for models that pass :func:`~hf_rstitch.fast.kernels.rope_store.defers_exactly`.

What it does not do: build anything. It runs no forward of the model and no kernel, only the modules' probes (the
head size comes from the caller, or from :func:`~hf_rstitch.fast.kv_shapes.kv_shape`, which the lane runs anyway
and keeps on the model).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
from transformers import PreTrainedModel

from .buckets import bucket_sizes
from .config import FastConfig
from .kernels import decode_attention, gemv, moe_router, norms, rope_store, triton_support
from .kv_shapes import kv_shape
from .module_plan import ModuleChoice, choices
from .patches import experts, folds, products, regions
from .rows import batch_sizes
from .windows import layer_windows


@dataclass(frozen=True)
class FastPlan:
    """The kernels and patches of one lane (see :func:`plan_for`); ``str()`` is a readable table."""

    model: str  # the model's class
    device: str
    dtype: str
    max_rows: int  # most rows of a batch the lane holds (FastEngine's max_batch)
    graphs: bool  # steps replayed as CUDA graphs (else run eagerly, as on CPU)
    batch_buckets: tuple[int, ...]  # a batch runs in the graph of the smallest bucket holding its rows
    length_buckets: tuple[int, ...]  # catch-ups padded to the smallest bucket holding them
    compile: str | None  # None, "parts", "decode" or "all" (FastConfig.compile)
    attention: str  # "split" (Triton, written slots only), "matmul" or "sdpa" (every slot)
    mask_free: bool  # every attention call runs the split kernel: steps build no mask
    products: str  # "triton" (tuned GEMV / gated-MLP kernels) or "cublas"
    gemv_tiers: tuple[int, ...]  # rows of the GEMV tiers tuned (cuBLAS past the last, or where it timed faster)
    fuse_qkv: bool  # q/k/v as one product
    fuse_mlp: bool  # a SiLU MLP's gate, up and activation as one kernel
    add_norm: bool  # each residual add with the norm after it as one compiled piece
    fold_norms: bool  # at one row, norms and adds folded into the products (where foldable)
    rope_store: bool  # k and v stored by one kernel; q and k rotated by one where the dtype and the model allow
    defer_rotation: bool  # rotation, k and v store as one kernel in the cache's update (where the probe agrees)
    rotary_table: bool  # rotary cos / sin gathered from a table (where the module's values are reproduced)
    windows: tuple[int | None, ...]  # each layer's sliding window (None: full attention)
    experts: str | None  # transformers' experts implementation (None: no experts)
    fuse_router: bool  # MoE routers as the two router kernels (where their form allows: .patches.routers)
    read_out: str  # "fused" (logits, entropy and greedy token in two kernels) or "eager"
    pdl: str  # programmatic dependent launch of the Triton kernels ("off", "one-row", "all")
    run_ahead: bool  # the loop may advance the lane a step early
    # with run_ahead, the loop goes on before a routing decision reaches the host (guessed, rolled back at a hand-over):
    # True; None: where the decision is on a device (a policy on the host, e.g. a custom one, is read first)
    ahead_of_decisions: bool | None = False
    # per module class: the fused kernel that runs in its place, or why its own code runs (.module_plan)
    modules: tuple[ModuleChoice, ...] = ()
    compile_note: str | None = None  # why compile="parts" was not applied (regions.NOT_BIT_EQUAL), else None

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)

    def __str__(self) -> str:
        lines = [f"FastLane plan for {self.model} ({self.device}, {self.dtype}, up to {self.max_rows} rows)"]
        lines += [f"  {name:<12} {text}" for name, text in self._lines()]
        lines += [f"  {'module':<12} {choice}" for choice in self.modules]
        return "\n".join(lines)

    def _lines(self) -> list[tuple[str, str]]:
        lengths = ", ".join(map(str, self.length_buckets))
        batches = ", ".join(map(str, self.batch_buckets))
        return [
            ("graphs", f"{'CUDA graphs' if self.graphs else 'eager steps'}; batch buckets {batches}; "
                       f"length buckets {lengths}"),
            ("compile", {None: "none", "parts": "parts (norm, rotary, gated activation; symbolic shapes)",
                         "decode": "decode (whole one-token steps)", "all": "all (whole steps, buckets too)"}
             [self.compile] + (f" ({self.compile_note})" if self.compile_note else "")),
            ("attention", {"split": "split (Triton, written slots only" + ("; steps build no mask)" if self.mask_free
                                                                            else "; masked fallback)"),
                           "matmul": "matmul (chunked products over every slot)",
                           "sdpa": "sdpa (one fused call over every slot)"}[self.attention]),
            ("products", self._products()),
            ("norms", self._norms()),
            ("rotary", self._rotary()),
            ("windows", self._windows()),
            ("experts", (self.experts or "none") + ("; routers as Triton kernels" if self.fuse_router else "")),
            ("read-out", "fused (entropy and greedy token in two kernels)" if self.read_out == "fused"
             else "eager"),
            ("launch", f"PDL {self.pdl}; run-ahead {'on' if self.run_ahead else 'off'}"),
            ("decisions", self._decisions()),
        ]

    def _decisions(self) -> str:
        if not self.run_ahead or self.ahead_of_decisions is False:
            return "read on the host before the next step is queued"
        if self.ahead_of_decisions:
            return "read a step late: the next step guessed (the model keeps control), rolled back at a hand-over"
        return ("read a step late where the policy decides on the device (the next step guessed, rolled back at a "
                "hand-over); a policy deciding on the host (a custom one) is read before the next step")

    def _products(self) -> str:
        if self.products == "cublas":
            return "cuBLAS"
        tiers = ", ".join(map(str, self.gemv_tiers))
        parts = [f"Triton GEMV tiers of {tiers} rows (cuBLAS past {self.gemv_tiers[-1]} rows and where it "
                 "timed faster)"]
        parts += ["q/k/v fused"] if self.fuse_qkv else []
        parts += ["gated MLP fused"] if self.fuse_mlp else []
        return "; ".join(parts)

    def _norms(self) -> str:
        if not self.add_norm:
            return "as the model computes them"
        return "add + norm as one piece" + ("; folded into the products at one row where foldable"
                                            if self.fold_norms else "")

    def _rotary(self) -> str:
        parts = ["the model's"] if not self.rope_store else [
            "rope_store kernels (k / v store; q / k rotation where it matches the model's)"
            + ("; rotation deferred to the cache's store where the probe agrees" if self.defer_rotation else "")]
        return "; ".join(parts + (["cos / sin table"] if self.rotary_table else []))

    def _windows(self) -> str:
        sliding = sorted({w for w in self.windows if w is not None})
        if not sliding:
            return f"full attention ({len(self.windows)} layers)"
        count = sum(w is not None for w in self.windows)
        return f"sliding window {', '.join(map(str, sliding))} on {count} of {len(self.windows)} layers"


def plan_for(model: PreTrainedModel, config: FastConfig, max_rows: int = 1, head_dim: int | None = None,
             spare_rows: int = 0) -> FastPlan:
    """The plan of a lane of ``max_rows`` rows (``spare_rows`` of them beyond its batch) for ``model`` under
    ``config`` (``head_dim``: the cache's head size; None: read by :func:`~hf_rstitch.fast.kv_shapes.kv_shape`). Raises as :class:`FastConfig` and
    :func:`~hf_rstitch.fast.patches.products.kernels_run` do (``gemv=True`` without Triton)."""
    device, dtype = model.device, model.dtype
    triton = triton_support.available(device)
    graphs = device.type == "cuda" if config.graphs is None else config.graphs
    attention = "matmul" if config.attention == "split" and not triton else config.attention
    head_dim = kv_shape(model)[2] if head_dim is None else head_dim
    kernels = products.kernels_run(model, config) and dtype in gemv.DTYPES  # float64 keeps cuBLAS
    partial = config.compile in (None, "parts")  # the step is not compiled whole
    rope = config.fuse_rope_store and partial and triton
    note = regions.why_not_parts(model) if config.compile == "parts" else None
    compile = None if note else config.compile  # parts not shown equal for this model type: its own code
    config = dataclasses.replace(config, compile=None, fuse_add_norm=None) if note else config
    add_norm = compile == "parts" and config.adds_with_norms
    moe = experts.plan(model, config.experts, routers=config.fuse_router)
    fold_norms = add_norm and kernels and config.fuse_qkv and config.fuse_mlp and folds.ENABLED
    return FastPlan(
        model=type(model).__name__, device=str(device), dtype=str(dtype), max_rows=max_rows, graphs=graphs,
        batch_buckets=batch_sizes(max_rows, spare_rows), length_buckets=bucket_sizes(config.max_bucket), compile=compile,
        attention=attention,
        mask_free=attention == "split" and decode_attention.runs_for(head_dim, dtype, device),
        products="triton" if kernels else "cublas",
        gemv_tiers=tuple(top for top, tuned in zip(gemv.TIERS, gemv.tiers_for(max_rows)) if tuned) if kernels else (),
        fuse_qkv=kernels and config.fuse_qkv, fuse_mlp=kernels and config.fuse_mlp,
        add_norm=add_norm, fold_norms=fold_norms,
        rope_store=rope, defer_rotation=rope and rope_store.DEFER, rotary_table=config.rotary_table and partial,
        windows=tuple(layer_windows(model.config)), experts=moe.kind, fuse_router=bool(moe.routers),
        read_out="fused" if device.type == "cuda" and triton and dtype != torch.float64 else "eager",
        pdl=triton_support.PDL if triton_support.pdl(device, 1) else "off",
        run_ahead=graphs if config.run_ahead is None else config.run_ahead,
        ahead_of_decisions=config.ahead_of_decisions,
        modules=choices(model, _norms_off(config, triton, dtype, device), None if add_norm else
                        f"add + norm fusion off (compile={compile!r})", _routers_off(config, dtype, device),
                        fold_norms),
        compile_note=note,
    )


def _norms_off(config: FastConfig, triton: bool, dtype: torch.dtype, device: torch.device) -> str | None:
    """Why the plan runs no RMSNorm kernel (None: it runs it for every norm whose probe agrees)."""
    if config.compile != "parts":
        return f"norms fused with compile='parts' only (compile={config.compile!r})"
    if not (triton and regions.KERNELS):
        return f"compiled, the kernel needs Triton ({device.type})"
    return None if dtype in norms.DTYPES else f"compiled, no kernel for {dtype}"


def _routers_off(config: FastConfig, dtype: torch.dtype, device: torch.device) -> str | None:
    """Why the plan runs no router kernel (None: it runs them for every router whose probe agrees)."""
    if not config.fuse_router:
        return "fuse_router=False"
    if not moe_router.available(device):
        return f"the kernels need Triton ({device.type})"
    return "no kernel for torch.float64" if dtype == torch.float64 else None
