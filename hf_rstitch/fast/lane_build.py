"""What a :class:`~hf_rstitch.fast.lane.FastLane` builds once, as its plan names it: its KV cache (static or paged),
its rotary patches, its compiled steps and its registered attention.

A mixin over the lane's state: ``model``, ``config``, ``plan``, ``n_pad``, ``gemv_layers``, ``_rotary`` and its
``_forward``.
"""

from __future__ import annotations

import functools
import warnings
import weakref

import torch
from transformers import AttentionInterface

from . import compile_cache
from .blocks import blocks_for
from .kernels import rope_store
from .kernels.rotary_modules import norm_plan
from .kernels.attention_support import refuse_fallback
from .kernels.decode_attention import decode_attention
from .kv_shapes import kv_shape
from .paged_kv import BlockPool, PagedKV
from .patches import regions, rotary_table
from .plan import FastPlan
from .static_kv import StaticKV, static_attention, static_attention_sdpa


def _warn_eager(device: torch.device) -> None:
    warnings.warn(f"the fast engine runs its static-cache steps eagerly on {device} (CUDA graphs need CUDA): same "
                  "outputs, no speed-up. Pass FastConfig(graphs=False) to silence this.", stacklevel=3)


def _allow_recompiles(limit: int) -> None:
    """Every lane compiles its own step (guards name the lane's buffers): raise dynamo's per-function
    recompile limit (default 8, i.e. two pairs of lanes) so later lanes are compiled, not run eagerly."""
    config = torch._dynamo.config
    name = "recompile_limit" if hasattr(config, "recompile_limit") else "cache_size_limit"
    setattr(config, name, max(getattr(config, name), limit))


class Build:
    """``_build_cache``, ``_rotation``, ``_compile`` and ``_register_attention`` of a FastLane."""

    def _build_cache(self, model, max_rows: int, n_slots: int, kv_blocks: int | None,
                     kv_pool: BlockPool | None) -> None:
        """The lane's KV cache of ``n_slots`` columns a row: paged with ``config.paged``, ``kv_blocks`` or
        ``kv_pool``, else static."""
        config, dev = self.config, self.device
        self.paged = config.paged or kv_blocks is not None or kv_pool is not None
        self.kv_blocks = kv_blocks  # as asked for (None: a static cache, or config.paged's full rows)
        if self.paged:  # blocks as rows write them (.paged_kv)
            pool = kv_pool or BlockPool(kv_shape(model), kv_blocks or 1 + max_rows * blocks_for(n_slots), model.dtype,
                                        dev)
            self.cache = PagedKV(pool, max_rows, n_slots, self.n_pad)
        else:
            self.cache = StaticKV(model.config, n_slots, model.dtype, dev, rows=max_rows, shape=kv_shape(model))

    def _rotation(self, plan: FastPlan, n_slots: int) -> None:
        """The rotary patches ``plan`` names: the rope_store kernels in place of the modelling modules'
        ``apply_rotary_pos_emb`` (module globals to swap, as regions do) with the cache's one-kernel store, and
        the cos / sin tables of its ``n_slots`` positions (instance forwards)."""
        self._rotary = rope_store.plan(self.model) if plan.rope_store else []
        self._qk_norms = norm_plan(self.model) if self._rotary else []  # normalized in the same kernel
        self.cache.fused_store = plan.rope_store
        self._rotary_tables = rotary_table.plan(self.model, n_slots) if plan.rotary_table else []

    def _compile(self, plan: FastPlan) -> None:
        """The steps and pieces ``plan.compile`` names: the elementwise regions (``"parts"``), or the one-token
        step and, with ``"all"``, every bucket's, compiled whole before capture."""
        self._decode_step = self._compiled_bucket = self._forward  # eager kernels (recorded in graphs on CUDA)
        self._regions = None
        if plan.compile is not None:
            compile_cache.use_persistent_cache()  # a later process reuses the kernels compiled here
            _allow_recompiles(64)  # a new model or norm class is a new compile (a symbolic length took minutes on 7B)
        if plan.compile == "parts":
            self._regions = regions.plan(self.model, keep_rotary=[m for m, _, _ in self._rotary],
                                         add_norm=plan.add_norm, products=self.gemv_layers, fold=plan.fold_norms)
        elif plan.compile is not None:  # static compiles: 1-token steps, and with "all" each bucket size
            self._decode_step = torch.compile(self._forward, fullgraph=True, dynamic=False)
        if plan.compile == "all":
            self._compiled_bucket = torch.compile(self._forward, fullgraph=True, dynamic=False)
    def _register_attention(self, kind: str) -> str:
        """The attention this lane runs (``plan.attention``), by registered name: a per-lane function bound to this
        lane's write offset, padding counts (``"split"``) and the model's layer windows (unregistered when the
        lane goes). Where the plan says every call runs the split kernel (``mask_free``), its fallback refuses."""
        windows = list(self.plan.windows)
        if kind == "split":
            fallback = refuse_fallback if self.plan.mask_free else functools.partial(static_attention, pos=self.cache.pos,
                                                                                 windows=windows)
            table = self.cache.table if self.paged and not self.cache.gather else None  # the kernel reads the blocks
            function = functools.partial(decode_attention, pos=self.cache.pos, pad=self.n_pad, fallback=fallback,
                                         windows=windows, table=table)
        else:
            base = static_attention_sdpa if kind == "sdpa" else static_attention
            function = functools.partial(base, pos=self.cache.pos, windows=windows)
        name = f"rstitch_{kind}_{id(self)}"
        AttentionInterface.register(name, function)
        weakref.finalize(self, AttentionInterface._global_mapping.pop, name, None)
        return name
