"""What the fast engine changes in a transformers model while a lane runs it: forwards installed around the
lane's calls, each only where a check proves it computes what the module computes.

* :mod:`.products`: which linear layers and MLPs run the GEMV and gated-MLP kernels (:mod:`.linears`,
  :mod:`.gated_mlp`), and the norms and residual adds folded into them at one row (:mod:`.folds`,
  :mod:`.add_norm`).
* :mod:`.regions`: the elementwise pieces of a layer compiled once (``compile="parts"``).
* :mod:`.rotary_table`: the rotary cos / sin read from a table.
* :mod:`.experts`: MoE experts dispatched on the device.

The kernels they install live in :mod:`hf_rstitch.fast.kernels`; the lane (:mod:`hf_rstitch.fast.lane`)
decides which patches apply.
"""
