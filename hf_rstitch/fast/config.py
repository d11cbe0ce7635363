"""FastConfig (the fast engine's options) and the check of which models a FastLane can drive."""

from __future__ import annotations

import dataclasses
import inspect
from dataclasses import dataclass
from typing import ClassVar

import torch
from transformers import PreTrainedModel

from . import capabilities
from .buckets import bucket_sizes
from .patches import experts
from . import windows
from .kv_shapes import kv_shape
from .static_kv import ATTENTIONS


@dataclass(frozen=True)
class FastConfig:
    """Options of the fast engine (``generate(..., stitch_engine=FastConfig(...))``)."""

    engine_kind: ClassVar[str] = "fast"  # the engine a spec of this type names (hf_rstitch.engine.EngineConfig.of)

    max_bucket: int = 128  # largest catch-up graph (power of two); longer catch-ups run as several
    graphs: bool | None = None  # CUDA graphs; None: on CUDA devices
    # torch.compile: None; "parts" (norm, rotary and gated activation, symbolic shapes: one compile each per
    # process, see .regions); whole steps before capture: "decode" (1-token steps) or "all" (buckets too)
    compile: str | None = None
    compile_max_bucket: int = 16  # with compile="all": buckets up to this size are compiled (one compile each)
    warm_up: bool = False  # capture (and compile) every bucket when a lane is built, not on first use
    # static-cache attention: "split" (a Triton kernel reading the written slots only; where Triton runs, else
    # "matmul"), "matmul" (chunked products over every slot) or "sdpa" (one fused call over every slot)
    attention: str = "split"
    gemv: bool | None = None  # tuned Triton kernel for one-row linear products; None: where Triton runs
    fuse_qkv: bool = True  # with gemv: q/k/v projections as one product (a copy of their weights)
    fuse_mlp: bool = True  # with gemv: a SiLU MLP's gate and up products and activation in one kernel (.gated)
    # where Triton runs and the step is not compiled whole: q/k rotation in one kernel, k/v cache writes in one
    fuse_rope_store: bool = True
    # where the step is not compiled whole: the rotary cos/sin of each call read from a table of every slot's
    # position (.rotary_table; one gather instead of ~8 kernels), for modules whose values it reproduces
    rotary_table: bool = True
    # the generate loop may advance a lane one step early (hf_rstitch.decode.loop); None: with graphs
    run_ahead: bool | None = None
    # with run_ahead: the generate loop queues the next step before a routing decision reaches the host (the
    # deciding model keeps control, guessed; undone by a position reset at a hand-over, hf_rstitch.decode.loop);
    # None: where the policy's decision is on a device (CUDA), not the host, and a guess pays; False (default: the
    # guess's CUDA path is tested on the CPU only, not yet timed or run on a GPU): the host reads it first
    ahead_of_decisions: bool | None = False
    # with compile="parts": each residual add of a pre-norm layer and the norm after it as one compiled piece
    # (.add_norm); None: on with compile="parts"
    fuse_add_norm: bool | None = None
    # MoE: the experts implementation the lane runs, "grouped_mm" / "batched_mm" (transformers') or "rstitch_gemv"
    # (decode-step kernels, .kernels.expert_gemv); None: rstitch_gemv on CUDA with Triton where the experts' layout
    # allows, else grouped_mm where the GPU has it (.capabilities), batched_mm elsewhere (.experts)
    experts: str | None = None
    # MoE routers of Qwen3-MoE's and Mixtral's form (softmax -> top-k -> renormalize) as two Triton kernels where
    # Triton runs (.patches.routers); False: the routers' own code
    fuse_router: bool = True
    # KV cache in blocks that rows own as they write (.paged_kv): memory follows the tokens written, not
    # rows x capacity. The request engine always pages (its pool sized by its kv_tokens); generate() keeps the
    # static cache unless this is set (then the pool holds every row's capacity: same memory, same outputs)
    paged: bool = False
    # each call runs only the rows that need its logits, gathered into the smallest batch bucket (.lane_compact);
    # None: where the cache is paged (gathering is an index there; a static cache copies the rows' slots); False
    # (default: a call with rows handed over makes two graph calls, each reading the weights; on an H200 serving a
    # 7B / 1.5B pair that cost more than the rows saved, docs/benchmarks.md "Serving: reasoning traffic")
    compact_rows: bool | None = False
    # which GPU features the lane uses (.capabilities): "native" (what the GPU has), "generic" (what an Ampere /
    # Ada GPU gets: every Hopper-only feature off); None: $HF_RSTITCH_PROFILE, else native
    profile: str | None = None
    # rows a join call of a request engine's lane prefills at once (its join twin's rows, .joins): a step's joiners
    # cost one weight read of each model a group of this many; None: .joins.default_rows (8; a paged lane's an
    # eighth of its batch, up to 32)
    join_rows: int | None = None
    # a paged lane of a request engine holds this many spare cache rows, in which its joining rows' prompts are read
    # by its next call as virtual rows (.virtual_rows: a chunk of the call's width a row, with the joiner's block
    # table), not by a join call of their own; 0: off (every join takes the join twin). 64: on an H200 (7B / 1.5B,
    # 8-256 clients) the engine's steps 3-17 % faster, joins from 4-27 % of a step to 0 (engine_variants_*_virtual)
    virtual_joins: int = 64

    def key(self) -> str:
        """``repr`` of this config as stored keys name it (the steps' kernels markers, stored proofs): with
        ``virtual_joins`` at 0, which decides no kernel and no proof (a request engine's spare rows are in its lanes'
        plans and cache shapes; a proof runs ``generate``, which joins no rows)."""
        return repr(dataclasses.replace(self, virtual_joins=0))

    def __post_init__(self):
        bucket_sizes(self.max_bucket)  # validates
        if self.join_rows is not None and (isinstance(self.join_rows, bool) or not isinstance(self.join_rows, int)
                                           or self.join_rows < 1):
            raise ValueError(f"join_rows must be None (8, or an eighth of a paged lane's batch up to 32) or an "
                             f"integer >= 1, got {self.join_rows!r}")
        if isinstance(self.virtual_joins, bool) or not isinstance(self.virtual_joins, int) or self.virtual_joins < 0:
            raise ValueError(f"virtual_joins must be an integer >= 0 (spare cache rows a call reads joining "
                             f"prompts in; 0: off), got {self.virtual_joins!r}")
        if self.compile_max_bucket < 1:
            raise ValueError(f"compile_max_bucket must be >= 1, got {self.compile_max_bucket}")
        if self.compile not in (None, "parts", "decode", "all"):
            raise ValueError(f"compile must be None, 'parts', 'decode' or 'all', got {self.compile!r}")
        if self.fuse_add_norm and self.compile != "parts":
            raise ValueError(f"fuse_add_norm=True fuses with compile='parts'; got compile={self.compile!r}")
        if self.experts not in (None, *experts.DISPATCHES):
            raise ValueError(f"experts must be None or one of {experts.DISPATCHES}, got {self.experts!r}")
        if self.profile is not None:
            capabilities.check_profile(self.profile)
        if self.attention not in (*ATTENTIONS, "split"):
            raise ValueError(f"attention must be one of {sorted((*ATTENTIONS, 'split'))}, got {self.attention!r}")

    @property
    def adds_with_norms(self) -> bool:
        """Whether residual adds run fused with the norms after them (``fuse_add_norm``, resolved)."""
        return self.compile == "parts" if self.fuse_add_norm is None else self.fuse_add_norm


def check_supported(model: PreTrainedModel, batch_size: int = 1) -> None:
    """Raise a clear error if ``model`` cannot run in a FastLane (any batch size >= 1): an encoder-decoder,
    layers other than full and sliding-window attention (:func:`.windows.why_not`), experts that do not
    dispatch through transformers' experts interface (:func:`hf_rstitch.fast.patches.experts.why_not`), a forward without an
    attention mask, layers whose keys and values one static cache cannot hold (:func:`~hf_rstitch.fast.kv_shapes.kv_shape`), or a dtype
    its GPU lacks (:func:`dtype_refusal`)."""
    if batch_size < 1:
        raise ValueError(f"the fast engine needs at least one row, got batch size {batch_size}.")
    if getattr(model.config, "is_encoder_decoder", False):
        raise ValueError("the fast engine supports decoder-only causal LMs only.")
    reason = windows.why_not(model) or experts.why_not(model)
    if reason is not None:
        raise ValueError(f"{reason}. Use stitch_engine='default'.")
    if "attention_mask" not in inspect.signature(model.forward).parameters:
        raise ValueError(f"{type(model).__name__}.forward takes no attention_mask; the fast engine cannot drive it.")
    reason = dtype_refusal(model)
    if reason is not None:
        raise ValueError(reason)
    kv_shape(model)  # raises KVShapeError (a ValueError) with the reason


def windowed(config) -> bool:
    """Whether any layer of this (text) config attends through a window (:func:`.windows.layer_windows`: the
    windows the eager engine's masks apply) or is not attention at all."""
    kinds = set(getattr(config, "layer_types", None) or ["full_attention"])
    return bool(kinds - {"full_attention"}) or any(w is not None for w in windows.layer_windows(config))


def dtype_refusal(model: PreTrainedModel) -> str | None:
    """Why ``model``'s dtype cannot run on its GPU (bfloat16 below compute capability 8.0); None when it can."""
    if model.device.type != "cuda" or model.dtype != torch.bfloat16 or capabilities.has("bfloat16", model.device):
        return None
    major, minor = torch.cuda.get_device_capability(model.device)
    return (f"{type(model).__name__} is in bfloat16, which {torch.cuda.get_device_name(model.device)} (compute "
            f"capability {major}.{minor}) has no kernels for (bfloat16 needs 8.0 or newer); load the models with "
            "torch_dtype=torch.float16 (or float32)")
