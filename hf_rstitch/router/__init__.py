"""R-Stitch+: a learned router on uncertain SLM steps, trained with DAPO and a latency-aware reward.

    from hf_rstitch.router import Router, RouterPolicy
    router = Router.from_pretrained(hf_rstitch.shipped("router"))   # or a Hub id; stitch_router="shipped" too
    llm.generate(**inputs, assistant_model=slm, stitch_router=router)          # threshold from router.config
    llm.generate(**inputs, assistant_model=slm, stitch_policy=RouterPolicy(router, 0.001))

Training: :func:`hf_rstitch.training.router.train_router` / ``rstitch train-router``. The names below
load torch on first use only, so ``hf_rstitch.router.config`` stays torch-free.
"""

from __future__ import annotations

from ..lazy import lazy_names

_LAZY = {"Router": ".model", "load_router": ".model", "RouterPolicy": ".policy", "assign_rows": ".policy",
         "policy_from_router": ".policy", "R2RRouter": ".r2r", "R2RPolicy": ".r2r", "load_r2r": ".r2r"}

__all__ = sorted(_LAZY)


__getattr__, __dir__ = lazy_names(__name__, _LAZY, globals())
