"""The fast engine's Triton kernels, their launches and their tuning: one module per kernel family.

* :mod:`.gemv`: the linear products of 1..64 rows (tiers), with an optional RMSNorm in front and a residual
  add behind at one row; :mod:`.gated`: the gated MLP's two products and its activation in one kernel.
* :mod:`.decode_attention`: attention over the static cache that reads only the written slots (split-K).
* :mod:`.rope_store`: the rotary embedding of q and k and the cache store of k and v in one launch.
* :mod:`.fused_entropy`: each step's normalized entropy and greedy token read out of the logits.
* :mod:`.triton_support`: Triton itself (optional), block sizes, timers, parallel compiles, PDL;
  :mod:`.tuning_cache`: the tuner's choices kept on disk.

They take tensors, and import nothing of the fast engine but :mod:`hf_rstitch.fast.graphs` (is a capture
running?) and :mod:`hf_rstitch.fast.windows` (an attention call's window). Which modules of a model run them, and
how, is :mod:`hf_rstitch.fast.patches`; the exceptions, each a kernel's own drop-in with its probe beside it, are
the attention functions of :mod:`.decode_attention` and the ``apply_rotary_pos_emb`` of :mod:`.rope_store`. On CPU they run under Triton's interpreter
(``TRITON_INTERPRET=1``, ``make test-kernels``).
"""
