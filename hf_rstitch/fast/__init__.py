"""The fast engine: stitched decoding on CUDA near the memory-bandwidth floor, at any batch size.

What CUDA users get without asking: ``generate(..., assistant_model=slm, stitch_threshold=tau)`` names
no engine, which means ``stitch_engine="auto"``: this engine with :data:`AUTO` where it can run the pair
and has been proven on its architecture and GPU (:mod:`.support`; kept on the LLM and reused by later calls;
:func:`release` frees it), the eager engine otherwise, the reason logged, and the
eager engine again for a call whose fast run fails (which engine runs and how it is built: :mod:`hf_rstitch.engine`). ``stitch_engine="default"`` (or ``HF_RSTITCH_ENGINE=default``)
keeps the eager engine; ``"fast"``, a :class:`FastConfig` or a :class:`FastEngine` of your own asks
for this one. It swaps the eager :class:`~hf_rstitch.decode.Lane` (forwards over a DynamicCache,
host-bound at a few hundred kernel launches per token) for :class:`FastLane`: a static KV cache,
one-token steps and bucketed catch-up prefills replayed as CUDA graphs per batch bucket, attention that reads only
the written slots (:mod:`hf_rstitch.fast.kernels.decode_attention`), linear products of up to 64 rows through tuned Triton
kernels (:mod:`hf_rstitch.fast.kernels.gemv`, :mod:`hf_rstitch.fast.kernels.gated`), and each step's logits read out of the graph with their hand-over
entropy and greedy token in two kernels (:mod:`hf_rstitch.fast.kernels.fused_entropy`).
The stitch loop, policies, trace and outputs are the default engine's.

What it does not do: sliding-window or hybrid attention, encoder-decoders.
Off CUDA it runs the same static-cache steps eagerly (``FastConfig(graphs=False)``), which is
how the CPU tests check it against the default engine. See docs/fast-engine.md.
"""

from .buckets import bucket_for, bucket_sizes
from .engine import AUTO, NO_TRITON, FastEngine, engine_for, release, why_not_triton
from .lane import FastConfig, FastLane, check_supported
from .plan import FastPlan, plan_for
from .static_kv import StaticKV, static_attention, static_attention_sdpa
from .support import why_not_fast

__all__ = ["AUTO", "NO_TRITON", "FastConfig", "FastEngine", "FastLane", "FastPlan", "StaticKV", "bucket_for",
           "bucket_sizes", "check_supported", "engine_for", "plan_for", "release",
           "static_attention",
           "static_attention_sdpa", "why_not_fast", "why_not_triton"]
