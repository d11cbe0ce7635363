"""Pure decision logic: entropy, routing policies, sampling and the decode trace.

Nothing in this package touches a model or a cache; everything takes tensors (or plain
numbers) and returns tensors. The decode loop in :mod:`hf_rstitch.decode` composes it.
"""
