"""Training the R-Stitch+ router: rollouts on a dev split, the DAPO loss and the latency-aware reward.

A client of evaluation (problems, grading, batched rollouts) and of the latency model; nothing at
decode time imports it: the trained router runs through :mod:`hf_rstitch.router`. The toy world and
its pair's training live in :mod:`hf_rstitch.toyworld`, on the same layer.
"""
