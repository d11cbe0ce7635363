"""The fast engine: stitched decoding at batch size 1 on CUDA near the memory-bandwidth floor.

Opt-in: ``generate(..., assistant_model=slm, stitch_threshold=tau, stitch_engine="fast")`` (or a
reusable :class:`FastEngine`). It swaps the default :class:`~hf_rstitch.engine.Lane` (eager
forwards over a DynamicCache, host-bound at a few hundred kernel launches per token) for
:class:`FastLane`: a static KV cache, one-token steps and bucketed catch-up prefills replayed
as CUDA graphs, and one-row linear products through tuned Triton kernels (:mod:`.gemv`). The
stitch loop, policies, trace and outputs are the default engine's.

What it does not do: batches (B > 1), sliding-window or hybrid attention, encoder-decoders.
Off CUDA it runs the same static-cache steps eagerly (``FastConfig(graphs=False)``), which is
how the CPU tests check it against the default engine. See docs/fast-engine.md.
"""

from .buckets import bucket_for, bucket_sizes
from .engine import FastEngine, resolve_engine
from .lane import FastConfig, FastLane, check_supported
from .static_kv import StaticKV, static_attention, static_attention_sdpa

__all__ = ["FastConfig", "FastEngine", "FastLane", "StaticKV", "bucket_for", "bucket_sizes", "check_supported",
           "resolve_engine", "static_attention", "static_attention_sdpa"]
