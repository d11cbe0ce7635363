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

import logging

import torch

from .kernels import triton_cache, triton_support
from .kernels.decode_attention import pending as attention_pending
from .patches import products

log = logging.getLogger("hf_rstitch.fast")


class Ahead:
    """``_precompile`` and ``_steps_ahead`` of a FastLane; ``ahead_error`` says why the steps were not built ahead."""

    ahead_error: str | None = None

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
        the lane reset. Anything it meets is left for the captures to build."""
        if not (triton_support.ahead_possible(self.device) and not self.paged and self.plan.compile in (None, "parts")
                and self._experts.kind is None):
            return
        top = self.config.max_bucket
        sizes = sorted({1, 2, min(16, top), top} & (set(self.buckets) | {1}))
        steps = [(False, 1)] + [(True, size) for size in sizes] if deferrable else [(False, size) for size in sizes]
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
        self.cache.states.zero_()
        self.reset()
