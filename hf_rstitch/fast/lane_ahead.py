"""Kernels a :class:`~hf_rstitch.fast.lane.FastLane` builds ahead, when it is built: all at once in parallel threads
(:func:`~hf_rstitch.fast.kernels.triton_support.compile_ahead`), not one after another at the first launch of each.

Two batches: before tuning, the tuner's candidates, the choices its table already holds and the split attention
of every bucket (:meth:`Ahead._precompile`); after it, every other kernel the steps of a few length buckets launch
-- norms, rotations, cache stores, the logits' read-out -- found by running those steps eagerly with each launch
compiled instead of run (:meth:`Ahead._steps_ahead`). Kernels, launch configurations and results do not change:
only when each is built. ``benchmarks/results/engine_warmup_*.md`` times the first call with them.

A mixin over the lane's state: model, config, plan, cache, buffers (``ids``, ``n_real``), row bookkeeping
(``rows``), and its ``_forward`` / ``_model_code`` / ``_read_out`` / ``reset``.
"""

from __future__ import annotations

import json
import logging

import torch

from .kernels import triton_cache, triton_support
from .kernels.decode_attention import pending as attention_pending
from .patches import products

log = logging.getLogger("hf_rstitch.fast")


class Ahead:
    """``_precompile`` and ``_steps_ahead`` of a FastLane; ``ahead_error`` says why the steps were not built ahead."""

    ahead_error: str | None = None
    steps_marked = False  # the steps' kernels were known to be in Triton's cache: not built ahead (_steps_ahead)

    def _precompile(self) -> None:
        """Build at once, in parallel threads, the Triton kernels this lane would build one by one: the tuner's
        candidates, the choices its table holds, and the split attention of every batch and length bucket. Triton's
        cache gets the package's compiled kernels for this machine first, where it ships them (:mod:`.triton_cache`)."""
        triton_cache.seed(self.device)
        jobs = products.pending(self.model, self.config, self.max_rows)
        if self.plan.attention == "split":
            heads = self.model.config.get_text_config().num_attention_heads
            jobs += attention_pending(self.cache.keys[0], self.cache.values[0], self.cache.pos, self.n_pad,
                                      heads, self.rows.sizes, sorted(set(self.buckets) | {1}),
                                      list(self.plan.windows), self.cache.table if self.paged else None)
        triton_support.precompile(jobs, self.device)

    def _steps_ahead(self, deferrable: bool) -> None:
        """Build at once, in parallel threads, every Triton kernel the one-row steps of a few length buckets launch
        (1, 2, 16 and the largest: the specializations the others share), by running them eagerly with each launch
        compiled instead of run; ``deferrable``: with the rotation put off to the cache's store, plus the one-token
        step without (what ``rope_store.defers_exactly`` compares). Lanes of whole-step compiles, a paged cache or
        experts (whose kernels launch directly, over routed indices) skip it; the cache it wrote into is zeroed and
        the lane reset. Anything it meets is left for the captures to build. Where an earlier process (or the
        shipped kernels) left a marker that a lane of the same signature built them all into this Triton cache
        (:func:`~hf_rstitch.fast.kernels.triton_cache.steps_marker`), nothing is run: the captures load them."""
        if not (triton_support.ahead_possible(self.device) and not self.paged and self.plan.compile in (None, "parts")
                and self._experts.kind is None):
            return
        top = self.config.max_bucket
        sizes = sorted({1, 2, min(16, top), top} & (set(self.buckets) | {1}))
        steps = [(False, 1)] + [(True, size) for size in sizes] if deferrable else [(False, size) for size in sizes]
        signature = self._steps_signature(steps)
        marker = triton_cache.steps_marker(self.device, signature)
        if marker is not None and marker.is_file():
            self.steps_marked = True
            return
        try:
            with torch.no_grad(), triton_support.compile_ahead(1 << 10, self.device):
                for defer, size in steps:
                    self.rows.start([0])
                    with self._model_code(defer):
                        logits, _ = self._forward(self.ids[:1, :size], 1 if size == 1 else self.n_real, False)
                    self._read_out(logits, self.device)
                    self.cache.pos.zero_()
        except Exception as err:  # noqa: BLE001 - the captures build what is left, one kernel after another
            self.ahead_error = f"{type(err).__name__}: {err}"
            log.debug("hf_rstitch: %s lane's kernels not built ahead (%s)", self.role, self.ahead_error)
        else:
            if marker is not None:
                triton_cache.mark(marker, signature)
        self.cache.states.zero_()
        self.reset()

    def _steps_signature(self, steps) -> str:
        """What decides the kernels :meth:`_steps_ahead` builds, not the number of layers: the model class, its
        distinct parameter shapes and dtypes, the plan (its layers' windows as a set), the configuration, the
        cache layer's shape (rows, heads, slots, head size), the read-out's width and the steps run."""
        shapes = sorted({(tuple(p.shape), str(p.dtype)) for p in self.model.parameters()})
        plan = {**self.plan.as_dict(), "windows": sorted({str(w) for w in self.plan.windows})}
        return json.dumps([type(self.model).__name__, shapes, plan, repr(self.config), list(self.cache.keys[0].shape),
                           self.vocab, steps], default=str)
