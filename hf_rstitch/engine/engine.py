"""Which engine runs a pair (:func:`choose`) and how it is built (:func:`build`): the one place that knows the kinds.

Two kinds run: ``"default"``, the eager lanes (:class:`~hf_rstitch.decode.protocol.EagerEngine`: any device, any
model), and ``"fast"``, static or paged caches and CUDA graphs (:mod:`hf_rstitch.fast`). A config asks for one of
them by name, or for ``"auto"`` (what a config naming none asks for, unless ``$HF_RSTITCH_ENGINE`` names one):

1. a lane builder of the caller's own (an ``EagerEngine``, a ``FastEngine``) runs as it is;
2. ``"default"`` runs the eager lanes;
3. ``"fast"`` runs the fast engine with the caller's FastConfig, else ``FastConfig()`` (``fast_like_auto`` on
   CUDA: :data:`~hf_rstitch.fast.AUTO`); where it cannot run, its errors are the caller's;
4. ``"auto"`` runs the fast engine with :data:`~hf_rstitch.fast.AUTO` where it is proven on the pair
   (:func:`hf_rstitch.fast.support.why_not_fast`: the proven architectures and GPUs are data there, and pairs
   that failed in this process), with :data:`~hf_rstitch.fast.NO_TRITON` where only Triton is missing
   (:func:`~hf_rstitch.fast.why_not_triton`), and the eager lanes otherwise; the reason for anything but AUTO is
   logged at INFO on ``hf_rstitch.fast`` once a process.

Before these, speculative verification (``speculate``, ``stitch_speculate=k``) runs the eager lanes: ``"auto"``
picks them, the fast engine named (or a FastEngine given) is refused by name (:func:`_speculating`).

:func:`build` turns the choice into an :class:`Engine`: its lane builder (the fast engine kept on the LLM for
``generate``, one of its own for the request engine), for requests its KV plan (:mod:`.kv_plan`), its lanes built
and warmed up now, and one fallback (:meth:`Engine.fall_back`): where ``"auto"`` picked the fast engine and it
fails -- while its lanes are built or warmed up here, or in a run (``generate`` reruns the call) -- the pair is
remembered as failed, one warning gives the reason, and the eager engine runs it. A kind the caller named is never
replaced: its errors are raised.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from typing import Any, NamedTuple

import torch

from ..core.devices import describe, is_sharded
from ..core.roles import Role
from ..decode.protocol import EagerEngine
from .config import EngineConfig
from .kv_plan import kv_plan
from .pair import Pair

log = logging.getLogger("hf_rstitch.fast")
_SAID: set[str] = set()  # messages logged at INFO already: a loop of generate calls says each once


class Choice(NamedTuple):
    """What runs a pair: ``kind`` (``"default"`` or ``"fast"``), in one line why (``reason``), the FastConfig
    the fast engine runs (``fast``; None for the eager lanes and a caller's own builder), and whether a failure
    of the fast engine falls back to the eager lanes (``fallback``: ``"auto"`` picked it)."""

    kind: str
    reason: str
    fast: Any = None
    fallback: bool = False
    proving: bool = False  # an unproven pair whose fast lanes prove themselves on their first call (fast.proof)


def choose(pair: Pair, cfg: EngineConfig) -> Choice:
    """The engine that runs ``pair`` under ``cfg``, and why (the rules: the module docstring)."""
    if cfg.speculate:
        return _speculating(cfg)
    if cfg.builder is not None:
        return Choice(cfg.kind, f"the caller's own {type(cfg.builder).__name__}")
    if cfg.kind == "default":
        return Choice("default", "named: stitch_engine='default' (--engine default, $HF_RSTITCH_ENGINE=default)")
    from ..fast import FastConfig, engine, proof  # here: the eager lanes run where the fast engine is not installed

    if cfg.kind == "fast":
        tuned = cfg.fast_like_auto and pair.device.type == "cuda"
        return Choice("fast", "named: stitch_engine='fast'",
                      _asked(cfg, cfg.fast or (engine.AUTO if tuned else FastConfig())))
    no_triton = engine.why_not_triton()
    config = _asked(cfg, engine.AUTO if no_triton is None else engine.NO_TRITON)
    reason, proving = engine.why_not_fast(pair.llm, pair.slm, cfg.max_batch), False
    if reason is not None:  # unproven in the lists: proven on this machine instead, where it can be (fast.proof)
        reason, proved = proof.unproven(pair.llm, pair.slm, cfg.max_batch, reason, config, engine.engine_for)
        proving = isinstance(proved, proof.Proving)
    if reason is not None:
        _say(f"hf_rstitch: stitch_engine='auto' runs the eager engine: {reason}")
        return Choice("default", reason)
    why = ("auto: proving the fast engine on this machine on the first call (hf_rstitch.fast.proof)" if proving
           else "auto: proven on this architecture and GPU (hf_rstitch.fast.support, or a stored proof)")
    if no_triton is not None:
        _say(f"hf_rstitch: stitch_engine='auto' runs the fast engine without torch.compile or Triton kernels "
             f"({engine.NO_TRITON}): {no_triton}")
        why = no_triton
    return Choice("fast", why, config, True, proving)


def _asked(cfg: EngineConfig, fast):
    """``fast`` (a FastConfig) with what ``cfg``'s flags set on it (``--virtual-joins``)."""
    return fast if cfg.virtual_joins is None else dataclasses.replace(fast, virtual_joins=cfg.virtual_joins)


def _speculating(cfg: EngineConfig) -> Choice:
    """Speculative verification (``stitch_speculate``) crops the caches after each LLM run: the eager lanes only.
    ``"auto"`` picks them; the fast engine named (or a FastEngine given) is refused by name."""
    eager = cfg.builder is None or getattr(cfg.builder, "eager", False)
    if cfg.kind == "fast" or not eager:
        named = type(cfg.builder).__name__ if cfg.builder is not None else "stitch_engine='fast'"
        raise ValueError(f"stitch_speculate={cfg.speculate} runs on the eager engine only (the fast engine's static "
                         f"caches and CUDA graphs do not roll back rejected drafts), but {named} was asked for. Use "
                         "stitch_engine='default' or 'auto' with stitch_speculate, or drop stitch_speculate.")
    if cfg.builder is not None:
        return Choice(cfg.kind, f"the caller's own {type(cfg.builder).__name__}")
    return Choice("default", f"stitch_speculate={cfg.speculate}: speculative verification runs on the eager engine")


def refuse_sharded(llm, slm, spec) -> None:
    """A fast engine the caller named runs single-device models only: a sharded model is refused here, naming the
    fix (``"auto"`` runs it on the eager lanes: :func:`~hf_rstitch.fast.support.why_not_fast` says so)."""
    cfg = spec if isinstance(spec, EngineConfig) else EngineConfig.of(spec)
    if cfg.kind != "fast" or not getattr(cfg.builder, "single_device", True):
        return
    for model, role in ((llm, Role.LLM), (slm, Role.SLM)):
        if is_sharded(model):
            raise ValueError(
                f"stitch_engine={spec!r} runs single-device models only (its static caches and CUDA graphs live on "
                f"one device), but the {role} is {describe(model)}. Use stitch_engine='default' for a model split "
                "with device_map or tensor parallelism.")


class Engine:
    """A pair's built engine: what :func:`build` made, handed down whole to what runs it (``stitch_loop``,
    :class:`~hf_rstitch.batching.RequestEngine`, ``rstitch eval``).

    Attributes:
        pair, config: what it was built for; ``kind`` and ``reason``: :func:`choose`'s answer.
        builder: makes the lanes (an ``EagerEngine`` or a ``FastEngine``).
        max_length: the longest prompt + new tokens a request may ask for (None: unbounded, the eager lanes).
        kv_tokens: tokens each paged KV pool holds (None: no pool).
    """

    def __init__(self, pair: Pair, config: EngineConfig, choice: Choice):
        self.pair, self.config, self.choice = pair, config, choice
        self.kind, self.reason = choice.kind, choice.reason
        self.max_length, self.kv_tokens = (config.max_length or None), None
        if config.requests and choice.kind == "fast":  # sized before the lanes: the pools come out of free memory
            self.max_length, self.kv_tokens = kv_plan(pair, config)
        elif config.requests:
            self.max_length = None  # eager lanes: caches that grow as rows write
        self.builder = config.builder or _builder(pair, config, choice)

    def __repr__(self) -> str:
        return f"Engine({self.kind}: {self.reason})"

    @property
    def requests_only(self) -> bool:
        """Its lanes run through the request engine at any batch size (the fast engine's: ``rstitch eval`` sends
        every method it can there, batch size 1 included)."""
        return self.kind == "fast"

    @property
    def may_fall_back(self) -> bool:
        return self.choice.fallback

    def lanes(self) -> dict:
        """``{Role.SLM: lane, Role.LLM: lane}``, fresh (the fast engine's are reused and reset), sized for the
        config: ``max_batch`` rows of ``max_length`` (+ ``spare_columns``) columns; for requests the eager lanes
        start with no row (requests join them) and the fast lanes hold paged pools of ``kv_tokens``."""
        llm, slm, cfg = self.pair.llm, self.pair.slm, self.config
        rows = 0 if cfg.requests and self.kind == "default" else cfg.max_batch
        capacity = (self.max_length or 0) + cfg.spare_columns
        extra = {"kv_tokens": self.kv_tokens} if cfg.requests and self.kind == "fast" else {}
        return self.builder.lanes(llm, slm, self.pair.vocab, rows, capacity, cfg.timing, **extra)

    def warm_up(self) -> None:
        """Build the lanes now and capture their graphs: every bucket with ``config.warm_up`` (where the FastConfig
        did not already), else, where a failure falls back, the smallest batch bucket (every length bucket: the
        failures an architecture brings show there). The eager lanes have nothing to capture."""
        built = self.lanes()
        if self.kind != "fast" or getattr(self.builder, "config", None) is not None and self.builder.config.warm_up:
            return
        if self.config.warm_up:
            for lane in built.values():
                lane.warm_up()
        elif self.may_fall_back:
            for lane in built.values():
                lane.warm_up(batch_sizes=[min(lane.rows.sizes)])

    def fall_back(self, err: BaseException) -> "Engine":
        """The one fallback: the eager engine for this pair after ``err`` failed the fast engine that ``"auto"``
        picked (the pair remembered as failed, its fast engine kept on the LLM dropped, one warning with the
        reason); ``err`` is raised again where the caller named the engine."""
        if not self.may_fall_back:
            raise err
        from ..fast import engine, support

        text = str(err).strip().splitlines()[0][:300] if str(err).strip() else ""
        reason = f"{type(err).__name__}: {text}"
        support.remember_failure(self.pair.llm, self.pair.slm, reason)
        self.pair.llm.__dict__.get(engine.ATTRIBUTE, {}).pop(self.choice.fast, None)  # free its caches and graphs
        log.warning("hf_rstitch: the fast engine failed on this pair (%s); the eager engine runs it instead, and "
                    "later stitch_engine='auto' calls of the pair go there directly", reason)
        return Engine(self.pair, self.config, Choice("default", f"the fast engine failed: {reason}"))


def _builder(pair: Pair, cfg: EngineConfig, choice: Choice):
    """The lane builder of a choice: the eager lanes', the fast engine kept on the LLM (``cfg.shared``), or one of
    the engine's own for ``max_batch`` rows."""
    if choice.kind == "default":
        return EagerEngine()
    from ..fast import FastEngine, engine_for, proof

    if cfg.shared:
        kept = engine_for
    else:
        @functools.cache
        def kept(llm, config):  # noqa: ARG001  (the request engine's own fast engine: made once, its lanes reused)
            return FastEngine(config, max_batch=cfg.max_batch)
    return proof.Proving(choice.fast, kept) if choice.proving else kept(pair.llm, choice.fast)


def build(pair: Pair, cfg: EngineConfig) -> Engine:
    """The engine that runs ``pair`` under ``cfg`` (:func:`choose`), built: for requests (``cfg.requests``) or with
    ``cfg.warm_up`` its lanes are built and warmed up now, and where that fails under ``"auto"``, the eager
    engine is returned instead (:meth:`Engine.fall_back`)."""
    choice = choose(pair, cfg)
    engine = Engine(pair, cfg, choice)
    if not (cfg.requests or cfg.warm_up):
        return engine  # generate: the lanes are built by the run, inside its fallback
    try:
        engine.warm_up()
    except Exception as err:  # noqa: BLE001  (any failure of the fast lanes: the eager lanes run the pair)
        engine = engine.fall_back(err)
    return engine


def _say(message: str) -> None:
    """INFO the first time in this process, DEBUG after."""
    log.log(logging.DEBUG if message in _SAID else logging.INFO, message)
    _SAID.add(message)


def rng_state(device: torch.device) -> Any:
    """The RNG states a sampled generation draws from: the CPU's and ``device``'s (CUDA); a rerun after a
    fallback starts from them (:func:`restore_rng`)."""
    cuda = torch.cuda.get_rng_state(device) if device.type == "cuda" else None
    return torch.get_rng_state(), cuda, device


def restore_rng(state) -> None:
    cpu, cuda, device = state
    torch.set_rng_state(cpu)
    if cuda is not None:
        torch.cuda.set_rng_state(cuda, device)
