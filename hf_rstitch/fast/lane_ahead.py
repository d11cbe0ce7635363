"""Kernels a :class:`~hf_rstitch.fast.lane.FastLane` builds ahead, when it is built: all at once in parallel threads
(:func:`~hf_rstitch.fast.kernels.triton_support.compile_ahead`), not one after another at the first launch of each.

Two batches: before tuning, the tuner's candidates, the choices its table already holds and the split attention
of every bucket (:meth:`Ahead.precompile`); after it, every other kernel the steps of a few length buckets launch
-- norms, rotations, cache stores, the logits' read-out -- found by running those steps eagerly with each launch
compiled instead of run (:meth:`Ahead.steps`). Kernels, launch configurations and results do not change:
only when each is built. ``benchmarks/results/engine_warmup_*.md`` times the first call with them. Its graphs, too,
may be captured ahead, at build rather than at first use (:meth:`Ahead.warm_up`).

A part the lane owns (``lane.ahead``), reading the lane's public attributes (model, config, plan, cache, rows,
buffers ``ids`` / ``n_real``) and running its public ``forward`` / ``run`` / ``model_code`` / ``outputs`` /
``reset``.
"""

from __future__ import annotations

import json
import logging
import time

import torch

from . import virtual_rows
from .buckets import kernel_class
from .kernels import triton_cache, triton_support
from .kernels.decode_attention import pending as attention_pending
from .patches import products

log = logging.getLogger("hf_rstitch.fast")


class Ahead:
    """The kernels of ``lane`` built ahead; ``error`` says why its steps were not, ``marked`` that they were known
    to be in Triton's cache already."""

    def __init__(self, lane):
        self.lane = lane
        self.error: str | None = None
        self.marked = False  # the steps' kernels were known to be in Triton's cache: not built ahead (steps)

    def precompile(self) -> None:
        """Build at once, in parallel threads, the Triton kernels this lane would build one by one: the tuner's
        candidates, the choices its table holds, and the split attention of every batch and length bucket. Triton's
        cache gets the package's compiled kernels for this machine first, where it ships them (:mod:`.triton_cache`)."""
        lane = self.lane
        triton_cache.seed(lane.device)
        jobs = products.pending(lane.model, lane.config, lane.max_rows)
        if lane.plan.attention == "split":
            heads = lane.model.config.get_text_config().num_attention_heads
            jobs += attention_pending(lane.cache.keys[0], lane.cache.values[0], lane.cache.pos, lane.n_pad,
                                      heads, lane.rows.sizes, sorted(set(lane.buckets) | {1}),
                                      list(lane.plan.windows), lane.cache.table if lane.paged else None)
        triton_support.precompile(jobs, lane.device)

    def steps(self, deferrable: bool, experts: bool) -> None:
        """Build at once, in parallel threads, every Triton kernel the one-row steps of a few length buckets launch
        (1, 2, 16 and the largest: the specializations the others share), by running them eagerly with each launch
        compiled instead of run; ``deferrable``: with the rotation put off to the cache's store, plus the one-token
        step without (what ``rope_store.defers_exactly`` compares); ``experts``: the lane dispatches experts. Lanes of whole-step compiles, a paged cache or
        experts (whose kernels launch directly, over routed indices) skip it; the cache it wrote into is zeroed and
        the lane reset. Anything it meets is left for the captures to build. Where an earlier process (or the
        shipped kernels) left a marker that a lane of the same signature built them all into this Triton cache
        (:func:`~hf_rstitch.fast.kernels.triton_cache.steps_marker`), nothing is run: the captures load them."""
        lane = self.lane
        if not (triton_support.ahead_possible(lane.device) and not lane.paged and lane.plan.compile in (None, "parts")
                and not experts):
            return
        top = lane.config.max_bucket
        sizes = sorted({1, 2, min(16, top), top} & (set(lane.buckets) | {1}))
        steps = [(False, 1)] + [(True, size) for size in sizes] if deferrable else [(False, size) for size in sizes]
        signature = self.signature(steps)
        marker = triton_cache.steps_marker(lane.device, signature)
        if marker is not None and marker.is_file():
            self.marked = True
            return
        try:
            with torch.no_grad(), triton_support.compile_ahead(1 << 10, lane.device):
                for defer, size in steps:
                    lane.rows.start([0])
                    with lane.model_code(defer):
                        logits, _ = lane.forward(lane.ids[:1, :size], 1 if size == 1 else lane.n_real, False)
                    lane.outputs.read(logits, lane.device)
                    lane.cache.pos.zero_()
        except Exception as err:  # noqa: BLE001 - the captures build what is left, one kernel after another
            self.error = f"{type(err).__name__}: {err}"
            log.debug("hf_rstitch: %s lane's kernels not built ahead (%s)", lane.role, self.error)
        else:
            if marker is not None:
                triton_cache.mark(marker, signature)
        lane.cache.states.zero_()
        lane.reset()

    def warm_up(self, want_hidden: bool = False, batch_sizes=None) -> float:
        """Capture (and compile) the lane's one-token step and every length bucket, for each batch bucket in
        ``batch_sizes`` (default: all of the lane's; those of spare rows, for virtual joins, up to the length bucket
        :data:`.virtual_rows.WIDEST`), over dummy tokens it then forgets: the lane's
        :meth:`~hf_rstitch.fast.lane.FastLane.warm_up`. A bucket whose kernels an earlier bucket of the same batch
        bucket and kernel class ran is only recorded (``lane.record_only``). Returns the seconds it took."""
        lane = self.lane
        start = time.perf_counter()
        warmed = set()  # (batch bucket, kernel class) run for real once: the class's other buckets only recorded
        with torch.no_grad():
            for b in batch_sizes or lane.rows.sizes:
                lane.reset()
                lane.rows.start([0] * b)
                for size in sorted(set(lane.buckets) | {1}):
                    if b > lane.rows.base and size > virtual_rows.WIDEST:  # spare rows: the calls virtual rows ride
                        continue
                    cls = (lane.rows.bucket, kernel_class(size))
                    lane.record_only = cls in warmed
                    try:
                        lane.run(torch.ones(b, size, dtype=torch.long, device=lane.device), want_hidden)
                    finally:
                        lane.record_only = False
                    warmed.add(cls)
                    lane.cache.pos.zero_()  # dummy tokens: nothing to keep
        lane.reset()
        if lane.device.type == "cuda":
            torch.cuda.synchronize(lane.device)
        return time.perf_counter() - start

    def signature(self, steps) -> str:
        """What decides the kernels :meth:`_steps_ahead` builds, not the number of layers: the model class, its
        distinct parameter shapes and dtypes, the plan (its layers' windows as a set), the configuration, the
        cache layer's shape (rows, heads, slots, head size), the read-out's width and the steps run."""
        lane = self.lane
        shapes = sorted({(tuple(p.shape), str(p.dtype)) for p in lane.model.parameters()})
        plan = {**lane.plan.as_dict(), "windows": sorted({str(w) for w in lane.plan.windows}),
                "modules": sorted({str(line[:2] + line[3:]) for line in lane.plan.modules})}  # not their counts
        return json.dumps([type(lane.model).__name__, shapes, plan, lane.config.key(), list(lane.cache.keys[0].shape),
                           lane.vocab, steps], default=str)
