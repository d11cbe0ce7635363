"""``EngineConfig``: what a pair's engine is asked to be -- its kind and its sizes -- with help text and validation.

Torch-free (the CLI configs import it: ``rstitch --help`` stays fast). ``ServeConfig`` and ``EvalConfig`` embed
it whole (their ``engine`` field); the CLI turns its fields into flags (``--engine``, ``--max-batch``, ...)
through :func:`hf_rstitch.cli.args.add_dataclass_args`, and :func:`embeds_engine` (:mod:`hf_rstitch.configs`)
lets their Python API keep taking those fields flat (``ServeConfig(engine="fast", max_batch=4)``). Which engine the config runs is
:func:`hf_rstitch.engine.choose`'s to say, how it is built :func:`hf_rstitch.engine.build`'s.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import Any

from ..configs import embeds, help_meta

ENGINE_NAMES = ("default", "fast", "auto")
HELD_COLUMNS = 32  # spare cache columns of a request engine whose schedule holds rows back (their padding grows)
ENGINE_ENV = "HF_RSTITCH_ENGINE"


def requested_engine(spec=None):
    """``spec`` itself unless it is None; else ``$HF_RSTITCH_ENGINE`` if set, else ``"auto"``."""
    if spec is not None:
        return spec
    value = os.environ.get(ENGINE_ENV, "").strip().lower()
    if not value:
        return "auto"
    if value not in ENGINE_NAMES:
        raise ValueError(f"{ENGINE_ENV}={os.environ[ENGINE_ENV]!r} names no stitch engine; expected one of "
                         f"{', '.join(ENGINE_NAMES)} (or unset it, which means auto).")
    return value


def engine_option(value, flag: str = "--engine") -> str:
    """An engine name: :func:`requested_engine` of ``value``, which must be one of :data:`ENGINE_NAMES`."""
    name = requested_engine(value)
    if name not in ENGINE_NAMES:
        raise ValueError(f"{flag} must be default, fast or auto, got {name!r}.")
    return name


@dataclass
class EngineConfig:
    """Which engine runs a pair and how large it is built. Every field has the CLI flag of its name
    (``kind``: ``--engine``, ``max_length``: ``--max-model-len``)."""

    kind: str | None = field(default=None, metadata=help_meta(
        "auto (the default, or $HF_RSTITCH_ENGINE): fast where it runs the pair, else default (the reason logged); "
        "default: eager lanes (any device, any model); fast: static or paged KV caches + CUDA graphs (CUDA, "
        "full-attention single-device models; see --kv-memory)", choices=list(ENGINE_NAMES), flag="engine"))
    max_batch: int = field(default=8, metadata=help_meta(
        "rows decoded together at most (requests of a continuous batch)"))
    max_length: int = field(default=0, metadata=help_meta(
        "longest prompt + new tokens a request may ask for with the fast engine; 0: the LLM's context window "
        "(max_position_embeddings), at most what the KV memory holds", flag="max-model-len"))
    kv_memory: float | None = field(default=0.9, metadata=help_meta(
        "fast engine on CUDA: fraction of the GPU's memory that the pair's weights and KV blocks may fill (the rest "
        "is for CUDA graphs and activations); KV memory follows the tokens rows write, requests join while their "
        "prompts' blocks are free, and rows that outgrow it wait again (docs/serving.md)"))
    kv_tokens: int | None = field(default=None, metadata=help_meta(
        "fast engine: KV tokens each model's paged pool holds (overrides --kv-memory); default: sized from "
        "--kv-memory (max-batch x max-length where that is unset)"))
    paged: bool = field(default=True, metadata=help_meta(
        "fast engine serving requests: paged KV caches (blocks rows own as they write); --no-paged: a static slab "
        "of max-length a row (kept to measure against)"))
    prefill_chunk: int = field(default=0, metadata=help_meta(
        "tokens of joining prompts each model reads a step while rows decode (fast engine): a long prompt joins "
        "over several steps instead of stalling the batch for its whole prefill; 0: the joins of a step prefill "
        "whole, together"))
    join_wait: int = field(default=4, metadata=help_meta(
        "steps a free row may stay empty while requests wait, so that joiners come in groups (one join prefill, a "
        "weight read of each model, per group instead of per step); a group of --join-group, or a batch decoding "
        "fewer rows than that, joins at once. Trade-off: a request's first token up to that many steps later, against "
        "fewer join forwards under load (docs/serving.md, join pacing). 0: join at once, every step a row is free"))
    join_group: int = field(default=8, metadata=help_meta(
        "with --join-wait: joiners that join at once without waiting (8: one join call of the fast engine); a batch "
        "decoding fewer rows than this counts as nearly empty and takes joiners at once"))
    virtual_joins: int | None = field(default=None, metadata=help_meta(
        "fast engine serving requests: spare cache rows a step's call reads joining prompts in (virtual rows), so a "
        "join costs that call a few rows instead of a join call of its own (a weight read of each model); 0: off, "
        "every join a call of its own; default: the fast engine's (64). docs/fast-engine.md, virtual joins"))
    fast: Any = field(default=None, metadata={"cli": False, "help":
        "a hf_rstitch.fast.FastConfig for the fast engine; None: FastConfig() when named, AUTO under auto"})
    builder: Any = field(default=None, metadata={"cli": False, "help":
        "a lane builder of the caller's own (an EagerEngine or a FastEngine), built on as it is"})
    fast_like_auto: bool = field(default=False, metadata={"cli": False, "help":
        "--engine fast on CUDA with no FastConfig runs auto's configuration (compile='parts', every graph "
        "captured at build), as rstitch eval does, instead of FastConfig()'s defaults"})
    requests: bool = field(default=False, metadata={"cli": False, "help":
        "lanes for a stream of requests (rows join and leave: the request engine's; fast lanes are proven at "
        "build) rather than one batch of max_batch rows (generate's)"})
    shared: bool = field(default=False, metadata={"cli": False, "help":
        "the fast engine kept on the LLM for this FastConfig (generate's: later calls reuse its graphs) rather "
        "than one of this engine's own"})
    spare_columns: int = field(default=0, metadata={"cli": False, "help":
        "columns the caches hold beyond max_length (padding of rows a schedule holds back)"})
    warm_up: bool = field(default=False, metadata={"cli": False, "help":
        "build the lanes at build time and capture every batch and length bucket then (before any timed request)"})
    timing: bool = field(default=False, metadata={"cli": False, "help":
        "record device-synchronised seconds of every forward call in the trace"})
    speculate: int = field(default=0, metadata={"cli": False, "help":
        "SLM drafts the LLM verifies in one forward while it has control (stitch_speculate; "
        "hf_rstitch.decode.speculate): the eager engine only, which auto then picks"})

    def __post_init__(self) -> None:
        if self.kind is not None and not isinstance(self.kind, str):
            raise TypeError(f"EngineConfig.kind must be None or one of {ENGINE_NAMES}, got {self.kind!r}; pass "
                            "a FastConfig as fast=, an EagerEngine or FastEngine as builder= (EngineConfig.of does).")
        self.kind = engine_option(self.kind)
        if isinstance(self.max_batch, bool) or not isinstance(self.max_batch, int) or self.max_batch < 1:
            raise ValueError(f"--max-batch must be >= 1, got {self.max_batch!r}")
        if self.max_length < 0:
            raise ValueError(f"--max-model-len must be >= 0 (0: the LLM's context window), got {self.max_length}")
        if self.kv_memory is not None and not 0 < self.kv_memory <= 1:
            raise ValueError(f"--kv-memory must be a fraction in (0, 1], got {self.kv_memory}")
        if self.kv_tokens is not None and self.kv_tokens < 1:
            raise ValueError(f"--kv-tokens must be >= 1 (or left out: sized from --kv-memory), got {self.kv_tokens}")
        if self.prefill_chunk is None or self.prefill_chunk < 0:
            raise ValueError(f"--prefill-chunk must be >= 0 tokens (0: joins prefill whole), got {self.prefill_chunk}")
        self.join_pacing()  # --join-wait / --join-group checked here
        if self.virtual_joins is not None and (isinstance(self.virtual_joins, bool)
                                               or not isinstance(self.virtual_joins, int) or self.virtual_joins < 0):
            raise ValueError(f"--virtual-joins must be an integer >= 0 (spare rows for joining prompts; 0: off), got "
                             f"{self.virtual_joins!r}")

    def join_pacing(self):
        """When a request engine's waiting requests join: :class:`~hf_rstitch.core.scheduling.JoinPacing` of
        ``join_wait`` and ``join_group``. Raises ValueError naming the flag."""
        from ..core.scheduling import JoinPacing

        return JoinPacing(self.join_wait, self.join_group)

    def for_requests(self, schedule=None) -> "EngineConfig":
        """This config for a request engine's lanes (rows join and leave), with :data:`HELD_COLUMNS` spare columns
        where ``schedule`` (``"now"``, ``"gather:K:M"``, a schedule object) holds rows back."""
        from ..core.scheduling import Immediate, parse_schedule

        held = parse_schedule(schedule) if schedule is None or isinstance(schedule, str) else schedule
        return dataclasses.replace(self, requests=True, spare_columns=0 if isinstance(held, Immediate) else HELD_COLUMNS)

    @classmethod
    def of(cls, spec=None, **fields: Any) -> "EngineConfig":
        """The config of a ``stitch_engine`` spec: None or a name (``kind``), a FastConfig (``fast``), or a lane
        builder of the caller's own (``builder``: an EagerEngine, a FastEngine); ``fields`` as for the class."""
        # a name, or what an EagerEngine, FastEngine or FastConfig names
        kind = spec if spec is None or isinstance(spec, str) else getattr(spec, "engine_kind", None)
        if spec is None or isinstance(spec, str) and spec in ENGINE_NAMES:
            return cls(kind=spec, **fields)
        if kind not in ENGINE_NAMES:
            raise ValueError(
                f"stitch_engine must be None, 'auto', 'default', 'fast', a hf_rstitch.fast.FastConfig, a "
                f"hf_rstitch.fast.FastEngine or a hf_rstitch.decode.EagerEngine, got {spec!r}.")
        builds = callable(getattr(spec, "lanes", None))  # a lane builder of the caller's own, else a FastConfig
        return cls(kind=kind, builder=spec if builds else None, fast=None if builds else spec, **fields)


ALIASES = {"engine": "kind", "max_model_len": "max_length"}  # the flat names of ServeConfig / EvalConfig's fields


def embeds_engine(**defaults: Any):
    """Class decorator for a config dataclass whose ``engine`` field is an :class:`EngineConfig`
    (:func:`hf_rstitch.configs.embeds`): its constructor also takes the engine's fields flat (``engine="fast"`` the
    kind, ``max_batch=4``, ``max_model_len=40``, ...), folded into ``engine`` over ``defaults``; reading
    ``cfg.max_batch`` reads ``cfg.engine.max_batch``."""
    return embeds("engine", EngineConfig, ALIASES, **defaults)
