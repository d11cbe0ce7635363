"""FastEngine: owns the two FastLanes of a model pair and reuses them across generations.

Capturing graphs (and compiling, if asked) costs far more than one generation's worth of host
time, so lanes are kept: ``generate(..., stitch_engine=engine)`` with the same engine object
reuses its lanes (and their graphs) whenever the models, their weights, vocabulary width and
configuration match and the capacity and batch size suffice; otherwise the lane is rebuilt.

``stitch_engine="fast"`` (or a :class:`FastConfig`) needs no object held by the user: the engine
for that configuration is kept on the LLM itself (``llm._rstitch_fast_engines``), so repeated
``generate`` calls on the same pair reuse its graphs, and it goes when the LLM goes (or with
:func:`release`). ``stitch_engine="auto"`` (what a call naming no engine runs) uses it with
:data:`AUTO` where it can, and the eager engine otherwise, logging why: which engine runs a pair, and how it is
built, is :mod:`hf_rstitch.engine`'s (:func:`~hf_rstitch.engine.choose`, :func:`~hf_rstitch.engine.build`).

The engine holds its models; drop it to free the caches and graphs.
"""

from __future__ import annotations

import logging
import os
import shutil
import time

from transformers import PreTrainedModel

from ..core.roles import Role
from .blocks import blocks_for
from .lane import FastConfig, FastLane, check_supported
from .plan import FastPlan
from .support import why_not_fast  # noqa: F401  (what auto asks first: hf_rstitch.engine.choose reads it here)

log = logging.getLogger("hf_rstitch.fast")
# what stitch_engine="auto" runs: the shortest warm-up of the compiled variants, every graph a call can need
# captured when its lanes are built (warm_up), so that no call pauses mid-way to capture a new bucket
AUTO = FastConfig(compile="parts", warm_up=True)
# "auto" where Triton cannot run: graphs of eager kernels (no GEMV, split attention or fused kernels)
NO_TRITON = FastConfig(gemv=False, attention="matmul", fuse_mlp=False, fuse_rope_store=False, warm_up=True)


class FastEngine:
    """Builds (or reuses) ``{Role.SLM: FastLane, Role.LLM: FastLane}`` for stitched decoding.

    Args:
        config: :class:`FastConfig` shared by both lanes.
        capacity: minimum cache capacity in tokens; a generation needing more rebuilds its lanes.
        max_batch: minimum rows the lanes hold; a generation with a larger batch rebuilds them (each
            batch size up to it runs in the graphs of its batch bucket, captured when the lane is built with
            ``config.warm_up``, else on first use). Below the engine it is one name, ``max_rows``:
            :class:`FastLane`'s, its plan's, and the products' down to the GEMV tiers they tune
            (:func:`~hf_rstitch.fast.kernels.gemv.tiers_for`).
        capacity_step: lanes are built for a multiple of this many tokens, so that generations of
            slightly different lengths (prompts of another length, one more new token) reuse them
            instead of rebuilding (a rebuild recaptures every graph: seconds for a 7B pair). The
            split attention reads only the written slots, so the spare slots cost memory, not time.
    """

    single_device = True  # static caches and CUDA graphs on one device (hf.placement refuses sharded models)
    engine_kind = "fast"  # the engine a spec of this type names (hf_rstitch.engine.EngineConfig.of)

    def __init__(self, config: FastConfig | None = None, capacity: int = 0, max_batch: int = 1,
                 capacity_step: int = 1024):
        if capacity_step < 1:
            raise ValueError(f"capacity_step must be >= 1, got {capacity_step}")
        self.config = config or FastConfig()
        self.capacity = capacity
        self.capacity_step = capacity_step
        self.max_batch = max_batch
        self._lanes: dict[Role, FastLane] = {}
        self._weights: dict[Role, tuple] = {}  # _weights(model) when each lane was built
        self.builds = 0  # lanes built so far (reuse check for tests and benchmarks)

    def lane(self, model: PreTrainedModel, role: Role, vocab: int, capacity: int, timing: bool = False,
             batch: int = 1, kv_tokens: int | None = None) -> FastLane:
        lane, weights = self._lanes.get(role), _weights(model)
        kv_blocks = None if kv_tokens is None else 1 + blocks_for(kv_tokens)  # a paged pool, with its trash block
        if (lane is None or lane.model is not model or lane.vocab != vocab or lane.capacity < capacity
                or lane.rows.base < batch or self._weights.get(role) != weights  # base: rows beside the spare ones
                or lane.kv_blocks != kv_blocks):  # a pool of another size (or none) than asked for
            self._lanes.pop(role, None)  # free the old buffers before allocating new ones
            room = -(-max(capacity, self.capacity, 1) // self.capacity_step) * self.capacity_step
            start = time.perf_counter()
            spare = self.config.virtual_joins if kv_blocks is not None else 0  # a request engine's lanes: cache
            # rows for joining prompts read as virtual rows (.virtual_rows), beyond the live rows' batch
            lane = FastLane(model, role, vocab, room, self.config, max_rows=max(batch, self.max_batch, 1) + spare,
                            kv_blocks=kv_blocks, spare_rows=spare)
            lane.build_seconds["lane"] = time.perf_counter() - start
            self._lanes[role], self._weights[role] = lane, weights
            self.builds += 1
            if self.config.warm_up:  # every bucket now: no generation pays a capture or compile mid-way
                lane.build_seconds["warm_up"] = lane.warm_up()
        else:
            lane.reset()
        lane.timing = timing
        return lane

    def lanes(self, llm: PreTrainedModel, slm: PreTrainedModel, vocab: int, batch_size: int, capacity: int,
              timing: bool = False, kv_tokens: int | None = None) -> dict[Role, FastLane]:
        """Both lanes; ``kv_tokens``: paged caches (:mod:`.paged_kv`) holding this many tokens each (the request
        engine's), None: as ``config.paged`` says."""
        check_supported(llm, batch_size)
        check_supported(slm, batch_size)
        return {
            Role.SLM: self.lane(slm, Role.SLM, vocab, capacity, timing, batch_size, kv_tokens),
            Role.LLM: self.lane(llm, Role.LLM, vocab, capacity, timing, batch_size, kv_tokens),
        }

    def plans(self) -> dict[Role, FastPlan]:
        """The plan of each lane built so far (``print(engine.plans()[Role.LLM])``: which kernels and patches it
        runs, :mod:`hf_rstitch.fast.plan`)."""
        return {role: lane.plan for role, lane in self._lanes.items()}

    def capture_seconds(self) -> float:
        """Host seconds spent warming up and recording graphs (compilation included)."""
        return sum(l.graphs.capture_seconds for l in self._lanes.values() if l.graphs is not None)

    def graph_count(self) -> int:
        return sum(len(l.graphs.graphs) for l in self._lanes.values() if l.graphs is not None)


def _weights(model: PreTrainedModel) -> tuple:
    """Where each parameter lives and how often it was written in place. A lane built over other weights
    (its fused q/k/v copy, graphs reading the old storage) would decode stale ones, so it is rebuilt."""
    try:
        return tuple((p.data_ptr(), p._version) for p in model.parameters())
    except RuntimeError:  # parameters made under inference_mode keep no version counter
        return tuple(p.data_ptr() for p in model.parameters())


ATTRIBUTE = "_rstitch_fast_engines"  # on the LLM: {FastConfig: FastEngine}


def engine_for(llm: PreTrainedModel, config: FastConfig | None = None) -> FastEngine:
    """The engine kept on ``llm`` for ``config`` (made now if there is none)."""
    config = config or FastConfig()
    engines = llm.__dict__.setdefault(ATTRIBUTE, {})
    if config not in engines:
        log.info("hf_rstitch: the fast engine (%s) is built for this LLM on first use: the first generate pays its "
                 "warm-up (GEMV tuning, Triton kernel builds, every graph captured: ~13 s for a 7B pair on a fresh "
                 "H100 with the shipped tuning table, more where none ships, ~6 s once its caches are warm), "
                 "later ones reuse it; "
                 "hf_rstitch.fast.release(llm) frees it, stitch_engine='default' or HF_RSTITCH_ENGINE=default "
                 "runs the eager engine", config)
        engines[config] = FastEngine(config)
    return engines[config]


def release(llm: PreTrainedModel) -> None:
    """Drop the engines kept on ``llm`` (their caches and graphs are freed with them)."""
    llm.__dict__.pop(ATTRIBUTE, None)


def why_not_triton() -> str | None:
    """Why Triton cannot run here (torch.compile's CUDA kernels, the GEMV and split-attention kernels);
    None when it can."""
    try:
        import triton  # noqa: F401
    except Exception as err:  # not installed, or built for another torch
        return f"triton is not importable ({type(err).__name__}: {err})"
    if not (os.environ.get("CC") or shutil.which("gcc") or shutil.which("clang")):
        return "triton finds no C compiler to build its kernel launchers (gcc or clang on PATH, or $CC)"
    return None
