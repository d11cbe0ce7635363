"""The methods that decode through stitched decoding, one small class each: R-Stitch (:class:`RStitch`, with
speculation :class:`Speculating`), random routing, the learned router (R-Stitch+), step-level routing and R2R.

Each sets the stitch arguments of its ``generate`` call (``_stitch_kwargs``) and reads the decode trace for its
counts; :meth:`StitchedMethod.engine_spec` gives the request engine the policy ``generate`` would resolve.
Registered with the baselines in :data:`hf_rstitch.eval.methods.METHODS`.
"""

from __future__ import annotations

import hashlib
from typing import Any, ClassVar

import torch

from .method_base import Method, param_text


def _require_stitching() -> None:
    import hf_rstitch

    if not hasattr(hf_rstitch, "stitched_decode"):
        raise RuntimeError(
            "this build of hf_rstitch has no stitched decoding yet (hf_rstitch.stitched_decode is missing), so "
            "R-Stitch / random / router methods cannot run; use --methods llm slm specdec."
        )


class StitchedMethod(Method):
    """Shared by the methods that go through stitched decoding and return ``out.stitch_traces``.

    Through ``generate`` they run the eager lanes: the harness sends them there only when the engine
    is ``default`` (eager); the fast engine runs them through the request engine (:mod:`.continuous`)."""

    stitch_engine: ClassVar[str] = "default"

    def _stitch_kwargs(self) -> dict[str, Any]:
        raise NotImplementedError

    def _generate(self, input_ids, **gen):
        _require_stitching()
        return self.llm.generate(input_ids, assistant_model=self.slm, stitch_engine=self.stitch_engine,
                                 **self._stitch_kwargs(), **gen)

    def engine_spec(self):
        """The policy ``generate`` would resolve from this method's stitch arguments."""
        from hf_rstitch.hf.decode import resolve_policy

        kw = self._stitch_kwargs()
        return {"policy": resolve_policy(kw.get("stitch_threshold"), kw.get("stitch_policy"),
                                         self.llm.generation_config, kw.get("stitch_router"), self.slm)}

    def _row_length(self, out, row, new):
        return out.stitch_traces[row].n_tokens

    def _counts(self, out, row, n_new):
        trace = out.stitch_traces[row]
        counts = dict(trace.summary())
        counts["new_tokens"] = n_new
        counts["_trace"] = trace  # the runner keeps it when --save-traces is on, then drops it
        return counts


class RStitch(StitchedMethod):
    """Entropy-guided stitching at threshold ``tau`` (Algorithm 1)."""

    kind = "rstitch"

    def __init__(self, llm, slm, settings, threshold: float):
        super().__init__(llm, slm, settings)
        self.param = float(threshold)

    @property
    def label(self) -> str:
        return f"R-Stitch τ={param_text(self.param)}"

    def _stitch_kwargs(self):
        return {"stitch_threshold": self.param}


class Speculating(RStitch):
    """R-Stitch at threshold ``tau`` with the LLM's runs verified ``k`` SLM drafts at a time (``stitch_speculate``):
    the tokens of :class:`RStitch` at the same threshold, fewer LLM forwards. One row per call (greedy, eager
    lanes), so the request engine does not run it (``engine_spec`` None)."""

    kind = "speculate"
    one_row = True

    def __init__(self, llm, slm, settings, threshold: float, k: int = 4):
        super().__init__(llm, slm, settings, threshold)
        self.k = k

    @property
    def label(self) -> str:
        return f"R-Stitch+spec k={self.k} τ={param_text(self.param)}"

    def _stitch_kwargs(self):
        return {"stitch_threshold": self.param, "stitch_speculate": self.k}

    def engine_spec(self):
        return None


class RandomRouting(StitchedMethod):
    """Baseline: each SLM step goes to the LLM with probability ``p`` (``RandomPolicy``)."""

    kind = "random"

    def __init__(self, llm, slm, settings, p: float):
        super().__init__(llm, slm, settings)
        self.param = float(p)

    @property
    def label(self) -> str:
        return f"Random p={param_text(self.param)}"

    def _stitch_kwargs(self):
        from hf_rstitch.core.policies import RandomPolicy

        return {"stitch_policy": RandomPolicy(self.param, seed=self.settings.seed)}


class LearnedRouter(StitchedMethod):
    """R-Stitch+: a learned router (a :class:`~hf_rstitch.router.Router`, or a folder / Hub id
    of one, loaded once here) passed through as ``stitch_router=``, with ``threshold``, if given,
    as ``stitch_threshold`` (the paper consults the router only above it; without one, the
    threshold saved in the router's config applies). An object that already implements
    :class:`~hf_rstitch.core.policies.RoutingPolicy` (e.g. a ``RouterPolicy``) runs as
    ``stitch_policy``.

    The record key names the router and the threshold exactly: ``router-<fingerprint>@<tau>``,
    the fingerprint a hash of the router's weights (of ``repr(policy)`` for a policy object other
    than a ``RouterPolicy``: give such a class a stable ``__repr__`` to resume its records).
    """

    kind, label_text = "router", "R-Stitch+"

    def __init__(self, llm, slm, settings, router: Any, threshold: float | None = None):
        super().__init__(llm, slm, settings)
        if router is None:
            raise ValueError(
                "the 'router' method needs a trained router: pass --router-path FOLDER_OR_HUB_ID "
                "(EvalConfig(router=...) in Python), or drop 'router' from --methods."
            )
        from hf_rstitch.core.policies import RoutingPolicy, check_threshold

        if not isinstance(router, RoutingPolicy):
            from hf_rstitch.router.model import load_router

            router = load_router(router, slm=slm)
        self.router = router
        self.threshold = None if threshold is None else check_threshold(threshold, "router_threshold")
        own = getattr(router, "threshold", None)
        self.param = self.threshold if self.threshold is not None or own is None else float(own)
        self.fingerprint = router_fingerprint(router)

    @property
    def name(self) -> str:
        base = f"{self.kind}-{self.fingerprint}"
        return base if self.param is None else f"{base}@{param_text(self.param)}"

    def _stitch_kwargs(self):
        from hf_rstitch.core.policies import RoutingPolicy

        # a ready RoutingPolicy runs as the policy; a Router goes to stitch_router
        arg = "stitch_policy" if isinstance(self.router, RoutingPolicy) else "stitch_router"
        kw: dict[str, Any] = {arg: self.router}
        if self.threshold is not None and arg == "stitch_router":
            kw["stitch_threshold"] = self.threshold
        return kw


class StepRouting(StitchedMethod):
    """Step-level routing (GlimpRouter): the SLM's entropy at each step's first token picks the step's
    writer (:class:`~hf_rstitch.core.policies_step.StepPolicy`); a step ends at ``delimiter``."""

    kind = "step"

    def __init__(self, llm, slm, settings, threshold: float, delimiter: str = "\n\n", tokenizer: Any = None):
        super().__init__(llm, slm, settings)
        from hf_rstitch.core.policies_step import StepPolicy

        if tokenizer is None:
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(llm.name_or_path)
        self.param = float(threshold)
        self.policy = StepPolicy(self.param, delimiter, tokenizer)

    @property
    def label(self) -> str:
        return f"Step τ={param_text(self.param)}"

    def _stitch_kwargs(self):
        return {"stitch_policy": self.policy}


class R2RRouting(StitchedMethod):
    """R2R (thu-nics/R2R): its neural router judges every SLM token; one LLM token, then the SLM again.
    ``router``: an R2R checkpoint (.pt, folder or Hub id, :mod:`hf_rstitch.router.r2r`), loaded once here;
    ``threshold``: its probability cut-off (default: the checkpoint's)."""

    kind, label_text = "r2r", "R2R"

    def __init__(self, llm, slm, settings, router: Any, threshold: float | None = None):
        super().__init__(llm, slm, settings)
        from hf_rstitch.router.r2r import R2RPolicy, load_r2r

        loaded = load_r2r(router, slm) if router is not None else None
        if loaded is None:
            raise ValueError(f"the 'r2r' method needs an R2R router checkpoint (a .pt file, a folder or Hub id of "
                             f"one), got {router!r}; pass --r2r-router PATH, or drop 'r2r' from --methods.")
        self.policy = R2RPolicy(loaded, threshold)
        self.param = self.policy.threshold

    @property
    def label(self) -> str:
        return f"R2R p={param_text(self.param)}"

    def _stitch_kwargs(self):
        return {"stitch_policy": self.policy}


def router_fingerprint(router: Any) -> str:
    """10 hex digits naming a router: a hash of its config and weights (a RouterPolicy's router
    and threshold; ``repr`` of any other policy object)."""
    digest = hashlib.sha256()
    inner = getattr(router, "router", None)
    if isinstance(router, torch.nn.Module) or isinstance(inner, torch.nn.Module):
        module = router if isinstance(router, torch.nn.Module) else inner
        if module is not router:
            digest.update(repr(float(router.threshold)).encode())
        digest.update(type(module).__qualname__.encode())
        for name, value in sorted(module.state_dict().items()):
            flat = value.detach().to("cpu").contiguous().reshape(-1)
            digest.update(f"{name}:{flat.dtype}:{tuple(value.shape)}".encode())
            digest.update(flat.view(torch.uint8).numpy().tobytes())
    else:
        digest.update(f"{type(router).__qualname__}:{router!r}".encode())
    return digest.hexdigest()[:10]
