"""The decoding methods the harness compares, one small class each.

Every method answers ``run_batch(input_ids, attention_mask) -> [(new_token_ids, counts), ...]``
for a left-padded batch, one pair per row from one ``generate`` call, and ``run(input_ids)`` for
one prompt (batch size 1): ``counts`` holds ``new_tokens``, ``llm_tokens``, ``slm_tokens`` and
``switches`` (plus the trace summary for stitched methods). Methods only call ``generate``;
timing, grading and records belong to the runner (:mod:`.runner` at batch size 1,
:mod:`.batched` for batches). Adding a method is a new class registered in ``METHODS``.

Token attribution: LLM-only and speculative decoding count every new token as the LLM's
(speculative decoding emits exactly the LLM's distribution; transformers does not report
accepted drafts), SLM-only as the SLM's, stitched methods read the decode trace.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass
from typing import Any, ClassVar

import torch


def param_text(x: float) -> str:
    """A method parameter as written in record keys: ``%g`` where that is exact (``0.02``,
    ``1e-05``), else the shortest exact form (``0.001000001``), so two values never share a key."""
    short = f"{x:g}"
    return short if float(short) == x else repr(float(x))


@dataclass(frozen=True)
class GenSettings:
    """Decoding settings shared by every method of one run."""

    max_new_tokens: int = 8192
    do_sample: bool = False
    temperature: float = 0.6
    top_p: float = 0.95
    seed: int = 0

    def kwargs(self) -> dict[str, Any]:
        kw: dict[str, Any] = {"max_new_tokens": self.max_new_tokens, "do_sample": self.do_sample}
        if self.do_sample:
            kw.update(temperature=self.temperature, top_p=self.top_p)
        else:  # silence checkpoint sampling defaults under greedy decoding
            kw.update(temperature=None, top_p=None, top_k=None)
        return kw


class Method:
    """Base: subclasses set ``kind`` and implement :meth:`_generate`."""

    kind: ClassVar[str] = ""
    label_text: ClassVar[str] = ""
    param: float | None = None

    def __init__(self, llm: Any, slm: Any, settings: GenSettings):
        self.llm, self.slm, self.settings = llm, slm, settings

    @property
    def name(self) -> str:
        """Record key: ``rstitch@0.02``, ``random@0.5``, ``llm``... (the parameter exactly)."""
        return self.kind if self.param is None else f"{self.kind}@{param_text(self.param)}"

    @property
    def label(self) -> str:
        return self.label_text

    def _generate(self, input_ids: torch.Tensor, **gen: Any) -> Any:
        raise NotImplementedError

    def _counts(self, out: Any, row: int, n_new: int) -> dict[str, Any]:
        return {"new_tokens": n_new, "llm_tokens": n_new, "slm_tokens": 0, "switches": 0}

    def _row_length(self, out: Any, row: int, new: list[int]) -> int:
        """New tokens of ``row`` before the padding of a batch: up to and including its first EOS."""
        eos = set(eos_ids(self.llm, self.slm))
        return next((i + 1 for i, t in enumerate(new) if t in eos), len(new))

    def run(self, input_ids: torch.Tensor, max_new_tokens: int | None = None) -> tuple[list[int], dict[str, Any]]:
        """Decode one prompt. ``input_ids``: ``[1, S]`` on the models' device."""
        return self.run_batch(input_ids, torch.ones_like(input_ids), max_new_tokens)[0]

    def run_batch(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, max_new_tokens: int | None = None,
                  **extra: Any) -> list[tuple[list[int], dict[str, Any]]]:
        """Decode a left-padded batch in one ``generate`` call. ``input_ids`` / ``attention_mask``:
        ``[B, S]`` on the models' device; ``extra`` goes to ``generate`` (e.g. ``pad_token_id``).
        Returns ``(new_token_ids, counts)`` per row; a row of a batch ends at its EOS."""
        gen = {**self.settings.kwargs(), **extra}
        if max_new_tokens is not None:  # warm-up calls
            gen["max_new_tokens"] = max_new_tokens
        if self.settings.do_sample:
            torch.manual_seed(self.settings.seed)
        with torch.inference_mode():
            out = self._generate(input_ids, attention_mask=attention_mask, return_dict_in_generate=True, **gen)
        news = out.sequences[:, input_ids.shape[1]:].tolist()
        if len(news) > 1:  # rows that finished early are padded up to the longest
            news = [new[: self._row_length(out, r, new)] for r, new in enumerate(news)]
        return [(new, self._counts(out, r, len(new))) for r, new in enumerate(news)]

    def engine_spec(self) -> dict[str, Any] | None:
        """How :class:`~hf_rstitch.batching.RequestEngine` runs this method (``policy=`` for the engine,
        ``role=`` for each request), or None when it runs through ``generate`` at batch size 1 only."""
        return None

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name})"


class LLMOnly(Method):
    kind, label_text = "llm", "LLM"

    def engine_spec(self):
        from hf_rstitch.core.roles import Role

        return {"role": Role.LLM}

    def _generate(self, input_ids, **gen):
        return self.llm.generate(input_ids, **gen)


class SLMOnly(Method):
    kind, label_text = "slm", "SLM"

    def engine_spec(self):
        from hf_rstitch.core.roles import Role

        return {"role": Role.SLM}

    def _generate(self, input_ids, **gen):
        return self.slm.generate(input_ids, **gen)

    def _counts(self, out, row, n_new):
        return {"new_tokens": n_new, "llm_tokens": 0, "slm_tokens": n_new, "switches": 0}


class _AssistantCallNotice(logging.Filter):
    """Drops the deprecation warning transformers' assisted generation raises about its own call: its candidate
    generator calls the assistant's ``generate`` with a ``generation_config`` and length arguments together
    ("Passing `generation_config` together with generation-related arguments ..."); nothing a caller can change."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "Passing `generation_config` together with" not in record.getMessage()


_ASSISTANT_CALL_NOTICE = _AssistantCallNotice()


class SpecDec(Method):
    """transformers' assisted generation with the same pair (no stitch arguments)."""

    kind, label_text = "specdec", "SpecDec"

    def _generate(self, input_ids, **gen):
        logging.getLogger("transformers.generation.utils").addFilter(_ASSISTANT_CALL_NOTICE)  # once: a set
        return self.llm.generate(input_ids, assistant_model=self.slm, **gen)


def _require_stitching() -> None:
    import hf_rstitch

    if not hasattr(hf_rstitch, "stitched_decode"):
        raise RuntimeError(
            "this build of hf_rstitch has no stitched decoding yet (hf_rstitch.stitched_decode is missing), so "
            "R-Stitch / random / router methods cannot run; use --methods llm slm specdec."
        )


class _Stitched(Method):
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


class RStitch(_Stitched):
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


class RandomRouting(_Stitched):
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


class LearnedRouter(_Stitched):
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


class StepRouting(_Stitched):
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


class R2RRouting(_Stitched):
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


def eos_ids(*models: Any) -> set[int]:
    """The EOS ids of the models' generation configs."""
    ids: set[int] = set()
    for m in models:
        eos = getattr(getattr(m, "generation_config", None), "eos_token_id", None)
        ids.update([eos] if isinstance(eos, int) else (eos or []))
    return ids


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


METHODS: dict[str, type[Method]] = {
    cls.kind: cls for cls in (LLMOnly, SLMOnly, SpecDec, RStitch, RandomRouting, LearnedRouter, StepRouting,
                               R2RRouting)
}
STITCHED_KINDS = frozenset(k for k, cls in METHODS.items() if issubclass(cls, _Stitched))


def build_methods(kinds: list[str], llm: Any, slm: Any, settings: GenSettings, *,
                  thresholds: list[float] = (), random_p: list[float] = (), router: Any = None,
                  router_threshold: float | None = None, step_thresholds: list[float] = (),
                  step_delimiter: str = "\n\n", tokenizer: Any = None, r2r_router: Any = None,
                  r2r_thresholds: list[float] = ()) -> list[Method]:
    """One method object per (kind, parameter): ``rstitch`` expands over ``thresholds``,
    ``random`` over ``random_p``, ``step`` over ``step_thresholds``, ``r2r`` over ``r2r_thresholds``
    (none given: the router's own)."""
    variants: dict[str, list[dict[str, Any]]] = {
        "rstitch": [{"threshold": t} for t in thresholds],
        "random": [{"p": p} for p in random_p],
        "router": [{"router": router, "threshold": router_threshold}],
        "step": [{"threshold": t, "delimiter": step_delimiter, "tokenizer": tokenizer} for t in step_thresholds],
        "r2r": [{"router": r2r_router, "threshold": t} for t in (r2r_thresholds or [None])],
    }
    methods: list[Method] = []
    for kind in kinds:
        if kind not in METHODS:
            raise ValueError(f"unknown method {kind!r}; choose from {sorted(METHODS)}.")
        for kw in variants.get(kind, [{}]):
            methods.append(METHODS[kind](llm, slm, settings, **kw))
    return methods
