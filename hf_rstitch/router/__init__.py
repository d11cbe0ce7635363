"""R-Stitch+: a learned router on uncertain SLM steps, trained with DAPO and a latency-aware reward.

    from hf_rstitch.router import Router, RouterPolicy
    router = Router.from_pretrained(hf_rstitch.shipped("router"))   # or a Hub id; stitch_router="shipped" too
    llm.generate(**inputs, assistant_model=slm, stitch_router=router)          # threshold from router.config
    llm.generate(**inputs, assistant_model=slm, stitch_policy=RouterPolicy(router, 0.001))

Training: :func:`hf_rstitch.router.train.train_router` / ``rstitch train-router``.
"""

from .model import Router, load_router
from .policy import RouterPolicy, assign_rows, policy_from_router

__all__ = ["Router", "RouterPolicy", "assign_rows", "load_router", "policy_from_router"]
