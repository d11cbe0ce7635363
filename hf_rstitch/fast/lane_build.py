"""What a :class:`~hf_rstitch.fast.lane.FastLane` runs in place of the model's code, built once as its plan names it:
a part the lane owns (``lane.kernels``).

Its registered attention (split kernel, chunked products or SDPA, bound to the lane's write offset and padding
counts), the experts' dispatch and router kernels, the tuned products, the rotary patches (rope_store kernels, cos /
sin tables), the compiled pieces of ``compile="parts"`` and whether the rotation is put off to the cache's store;
:meth:`LaneKernels.installed` puts them in place for the model's Python code, :meth:`LaneKernels.steps` compiles the
lane's forward as ``compile="decode"`` / ``"all"`` ask.

What it does not do: decide (the plan does: :mod:`hf_rstitch.fast.plan`), or run a step (the lane does).
"""

from __future__ import annotations

import contextlib
import functools
import warnings
import weakref

import torch
from transformers import AttentionInterface

from . import compile_cache
from .kernels import rope_store
from .kernels.attention_support import refuse_fallback
from .kernels.decode_attention import decode_attention
from .kernels.rotary_modules import norm_plan
from .patches import experts, linears, regions, rotary_table
from .paged_kv import PagedKV
from .plan import FastPlan
from .static_kv import static_attention, static_attention_on, static_attention_sdpa


def warn_eager(device: torch.device) -> None:
    warnings.warn(f"the fast engine runs its static-cache steps eagerly on {device} (CUDA graphs need CUDA): same "
                  "outputs, no speed-up. Pass FastConfig(graphs=False) to silence this.", stacklevel=3)


def _allow_recompiles(limit: int) -> None:
    """Every lane compiles its own step (guards name the lane's buffers): raise dynamo's per-function
    recompile limit (default 8, i.e. two pairs of lanes) so later lanes are compiled, not run eagerly."""
    config = torch._dynamo.config
    name = "recompile_limit" if hasattr(config, "recompile_limit") else "cache_size_limit"
    setattr(config, name, max(getattr(config, name), limit))


class LaneKernels:
    """The kernels and patches ``plan`` names for ``model``, over the lane's ``cache`` of ``n_slots`` columns a
    row (``n_pad``: its rows' padding counts); ``products``: the tuned products' (module, forward) pairs."""

    def __init__(self, model, plan: FastPlan, cache, n_pad: torch.Tensor, n_slots: int, products: list):
        self.model, self.plan, self.cache, self.products = model, plan, cache, products
        self.attention = self._register(plan.attention, n_pad)
        # MoE: a dispatch that stays on the device, the routers as kernels (.experts)
        self.experts = experts.plan(model, plan.experts, plan.fuse_router)
        # the split kernel masks by the write offset and padding counts: no step builds a mask it would not read
        self.no_mask = torch.ones(1, 1, n_slots, dtype=torch.bool, device=model.device) if plan.mask_free else None
        # the rope_store kernels in place of the modelling modules' apply_rotary_pos_emb (module globals to swap, as
        # regions do) with the cache's one-kernel store, and the cos / sin tables of its positions (instance forwards)
        self.rotary = rope_store.plan(model) if plan.rope_store else []
        self.qk_norms = norm_plan(model) if self.rotary else []  # normalized in the same kernel
        cache.fused_store = plan.rope_store
        self.rotary_tables = rotary_table.plan(model, n_slots) if plan.rotary_table else []
        self.regions = None
        if plan.compile is not None:
            compile_cache.use_persistent_cache()  # a later process reuses the kernels compiled here
            _allow_recompiles(64)  # a new model or norm class is a new compile (a symbolic length took minutes on 7B)
        if plan.compile == "parts":
            self.regions = regions.plan(model, keep_rotary=[m for m, _, _ in self.rotary], add_norm=plan.add_norm,
                                        products=products, fold=plan.fold_norms)
        self.defer = False  # the rotation put off to the cache's store (the lane sets it once its probe agrees)

    @property
    def deferrable(self) -> bool:
        """The plan defers the rotation and this model has rotary functions the kernels replace."""
        return bool(self.rotary) and self.plan.defer_rotation

    def steps(self, forward):
        """``(decode step, bucket step)``: ``forward`` compiled whole as ``plan.compile`` asks (``"decode"``: one-token
        steps; ``"all"``: buckets too), else ``forward`` itself (eager kernels, recorded in graphs on CUDA)."""
        whole = self.plan.compile in ("decode", "all")
        decode = torch.compile(forward, fullgraph=True, dynamic=False) if whole else forward
        bucket = torch.compile(forward, fullgraph=True, dynamic=False) if self.plan.compile == "all" else forward
        return decode, bucket

    @contextlib.contextmanager
    def installed(self, defer: bool | None = None, poison: bool = False):
        """Dispatch for the model's Python code: static-cache attention, the experts' dispatch, tuned GEMV for one-row
        products, the compiled regions and rotary patches, the rotation put off to the cache's store (``defer``,
        default: :attr:`defer`)."""
        defer = self.defer if defer is None else defer
        with static_attention_on(self.model, self.attention), experts.experts_on(self.experts), \
                linears.gemv_linears_on(self.products), \
                regions.regions_on(self.regions), regions.regions_on((self.rotary_tables, self.rotary)), \
                rope_store.deferring(self.cache if defer else None, poison, self.qk_norms):
            yield

    @contextlib.contextmanager
    def running(self, role, defer: bool | None = None, poison: bool = False):
        """:meth:`installed`, and afterwards a check that every rotation put off to the cache's store was completed by
        a store (``role`` names the lane in the error)."""
        try:
            with self.installed(defer, poison):
                yield
        finally:
            pending, self.cache.pending = self.cache.pending, None
        if pending is not None:  # a rotation no update() completed: its q_out was never filled
            raise RuntimeError(f"{role} FastLane: a layer rotated q and k but stored no keys; this model's "
                               "attention code is not the one the deferred rotation supports. Build the lane with "
                               "FastConfig(fuse_rope_store=False).")

    def _register(self, kind: str, n_pad: torch.Tensor) -> str:
        """The attention this lane runs (``plan.attention``), by registered name: a function bound to the cache's write
        offset, padding counts (``"split"``) and the model's layer windows (unregistered when this part goes). Where
        the plan says every call runs the split kernel (``mask_free``), its fallback refuses."""
        windows, cache = list(self.plan.windows), self.cache
        if kind == "split":
            fallback = (refuse_fallback if self.plan.mask_free
                        else functools.partial(static_attention, pos=cache.pos, windows=windows))
            # a paged cache whose blocks the kernel reads (else the eager attentions read a gathered copy)
            table = cache.table if isinstance(cache, PagedKV) and not cache.gather else None
            function = functools.partial(decode_attention, pos=cache.pos, pad=n_pad, fallback=fallback,
                                         windows=windows, table=table)
        else:
            base = static_attention_sdpa if kind == "sdpa" else static_attention
            function = functools.partial(base, pos=cache.pos, windows=windows)
        name = f"rstitch_{kind}_{id(self)}"
        AttentionInterface.register(name, function)
        weakref.finalize(self, AttentionInterface._global_mapping.pop, name, None)
        return name
