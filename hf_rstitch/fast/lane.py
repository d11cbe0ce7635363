"""FastLane: a :class:`~hf_rstitch.engine.Lane` for CUDA at batch size 1, built for speed.

Same contract as ``Lane.advance`` -- run the model over the columns of the shared sequence it
has not seen, return the last column's logits -- with three changes underneath:

* a static KV cache (:class:`~hf_rstitch.fast.static_kv.StaticKV`) whose slot ``j`` holds
  column ``j``; the mask of a step is built on the device from the write offset, so no step
  needs the host to know where it writes;
* every call of up to ``max_bucket`` tokens runs as a CUDA graph: one-token decode steps, and
  catch-up prefills padded to a power-of-two bucket (:mod:`hf_rstitch.fast.buckets`). A
  longer catch-up (a long run of the other model, or a long prompt) runs as several calls of the
  largest bucket and one for the rest;
* one-row products of the linear layers run a Triton GEMV kernel tuned per weight shape on the
  device (:mod:`hf_rstitch.fast.gemv`; where Triton is installed), cuBLAS otherwise;
* optionally the step is compiled with ``torch.compile`` (fused elementwise kernels) before
  it is captured.

Per call the host does: one device copy of the new token ids into the graph's input buffer,
a ``fill_`` of the real-token count for padded buckets, one replay, one copy of the logits out
of the graph's buffer (they are overwritten by the next replay, and the other model may run
first). It never waits for the device; the stitch loop's routing decision is the only sync.

Padding: padded tokens are written to the slots just past the real ones, are invisible to
every real query (causal mask) and are overwritten by the next call before anything can
attend to them. The prompt may be left-padded; those slots are masked out for good.

Reuse: a lane keeps its graphs across generations (:meth:`reset`); graphs record the model's
weight addresses, so replace no parameter tensors of a model while a lane for it is alive
(in-place updates are fine). See :func:`hf_rstitch.fast.fast_lanes` for the cached builder.
"""

from __future__ import annotations

import contextlib
import inspect
import time
import warnings
from dataclasses import dataclass

import torch
from transformers import PreTrainedModel

from ..core.roles import Role
from ..core.trace import CallKind, ForwardCall
from . import gemv
from .buckets import bucket_for, bucket_sizes, round_up
from .graphs import GraphRunner
from .static_kv import ATTENTIONS, KV_CHUNK, StaticKV, static_attention_on


@dataclass(frozen=True)
class FastConfig:
    """Options of the fast engine (``generate(..., stitch_engine=FastConfig(...))``)."""

    max_bucket: int = 128  # largest catch-up graph (power of two); longer catch-ups run as several
    graphs: bool | None = None  # CUDA graphs; None: on CUDA devices
    compile: str | None = None  # torch.compile before capture: None, "decode" (1-token steps) or "all" (buckets too)
    compile_max_bucket: int = 16  # with compile="all": buckets up to this size are compiled (one compile each)
    warm_up: bool = False  # capture (and compile) every bucket when a lane is built, not on first use
    attention: str = "matmul"  # static-cache attention: "matmul" (chunked products) or "sdpa" (one fused call)
    gemv: bool | None = None  # tuned Triton kernel for one-row linear products; None: where Triton runs
    fuse_qkv: bool = True  # with gemv: q/k/v projections as one product (a copy of their weights)

    def __post_init__(self):
        bucket_sizes(self.max_bucket)  # validates
        if self.compile_max_bucket < 1:
            raise ValueError(f"compile_max_bucket must be >= 1, got {self.compile_max_bucket}")
        if self.compile not in (None, "decode", "all"):
            raise ValueError(f"compile must be None, 'decode' or 'all', got {self.compile!r}")
        if self.attention not in ATTENTIONS:
            raise ValueError(f"attention must be one of {sorted(ATTENTIONS)}, got {self.attention!r}")


def check_supported(model: PreTrainedModel, batch_size: int = 1) -> None:
    """Raise a clear error if ``model`` cannot run in a FastLane."""
    if batch_size != 1:
        raise ValueError(
            f"the fast engine runs batch size 1 only, got batch size {batch_size}. Use the default engine "
            "(stitch_engine='default') for batches, or call generate once per prompt."
        )
    config = model.config.get_text_config()
    if getattr(model.config, "is_encoder_decoder", False):
        raise ValueError("the fast engine supports decoder-only causal LMs only.")
    kinds = set(getattr(config, "layer_types", None) or ["full_attention"])
    if kinds != {"full_attention"} or getattr(config, "use_sliding_window", False):
        raise ValueError(
            f"the fast engine supports full-attention models only; {type(model).__name__} has layer types "
            f"{sorted(kinds)} (sliding_window={getattr(config, 'sliding_window', None)}). Use stitch_engine='default'."
        )
    if "attention_mask" not in inspect.signature(model.forward).parameters:
        raise ValueError(f"{type(model).__name__}.forward takes no attention_mask; the fast engine cannot drive it.")


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _allow_recompiles(limit: int) -> None:
    """Every lane compiles its own step (guards name the lane's buffers): raise dynamo's per-function
    recompile limit (default 8, i.e. two pairs of lanes) so later lanes are compiled, not run eagerly."""
    config = torch._dynamo.config
    name = "recompile_limit" if hasattr(config, "recompile_limit") else "cache_size_limit"
    setattr(config, name, max(getattr(config, name), limit))


_GEMV_TABLE: dict = {}  # tuned configurations, shared by every lane of the process (keyed by shape and device)


class FastLane:
    """One model with a static cache and captured steps, advanced over a shared sequence (B = 1).

    Args:
        model: a full-attention causal LM (Llama, Qwen2, Mistral, ... family).
        role: :class:`Role.SLM` or :class:`Role.LLM`.
        vocab: logits are cut to this width.
        capacity: longest sequence (prompt + new tokens) the lane must hold.
        config: :class:`FastConfig`.
        timing: record device-synchronised seconds of each call in its ForwardCall (adds a sync).
    """

    def __init__(self, model: PreTrainedModel, role: Role, vocab: int, capacity: int,
                 config: FastConfig | None = None, timing: bool = False):
        check_supported(model)
        self.config = config = config or FastConfig()
        self.model, self.role, self.vocab, self.timing = model, role, vocab, timing
        self.device = model.device
        graphs = self.device.type == "cuda" if config.graphs is None else config.graphs
        if config.graphs is None and not graphs:
            warnings.warn(f"the fast engine runs its static-cache steps eagerly on {self.device} (CUDA graphs need "
                          "CUDA): same outputs, no speed-up. Pass FastConfig(graphs=False) to silence this.",
                          stacklevel=2)
        self.graphs = GraphRunner(self.device) if graphs else None  # raises off CUDA
        self.capacity = capacity
        self.buckets = bucket_sizes(config.max_bucket)
        dev = self.device
        n_slots = round_up(capacity + config.max_bucket, KV_CHUNK)  # padded writes stay inside; whole chunks
        self.cache = StaticKV(model.config, n_slots, model.dtype, dev)
        self.slot_ids = torch.arange(n_slots, device=dev)  # [S]
        self.valid = torch.ones(n_slots, dtype=torch.bool, device=dev)  # False on left-padding slots
        self.n_pad = torch.zeros((), dtype=torch.long, device=dev)  # left-padding columns of the prompt
        self.ids = torch.zeros(1, config.max_bucket, dtype=torch.long, device=dev)  # graph input
        self.n_real = torch.ones((), dtype=torch.long, device=dev)  # real tokens in a padded bucket
        self.seen = 0  # columns of the shared sequence in the cache
        self.pads = 0  # host copy of n_pad
        self.long_calls = 0  # calls of this generation longer than max_bucket (run as several bucket calls)
        self.gemv_tune_seconds = 0.0
        self.gemv_layers = self._gemv_plan(config)  # [] keeps cuBLAS everywhere
        params = inspect.signature(model.forward).parameters
        self._cache_arg = "cache" if "cache" in params else "past_key_values"  # renamed in transformers 5.24
        self._decode_step = self._compiled_bucket = self._forward  # eager kernels (recorded in graphs on CUDA)
        if config.compile is not None:  # static compiles: 1-token steps, and with "all" each bucket size
            _allow_recompiles(64)  # (a symbolic length took minutes on 7B)
            self._decode_step = torch.compile(self._forward, fullgraph=True, dynamic=False)
        if config.compile == "all":
            self._compiled_bucket = torch.compile(self._forward, fullgraph=True, dynamic=False)

    # ---- the Lane interface -------------------------------------------------------------------
    def advance(self, seq: torch.Tensor, mask: torch.Tensor, rows: torch.Tensor, resumed: torch.Tensor,
                want_hidden: bool = False):
        """As :meth:`hf_rstitch.engine.Lane.advance` (batch size 1)."""
        if seq.shape[0] != 1:
            raise ValueError(f"FastLane runs batch size 1, got a sequence of shape {tuple(seq.shape)}")
        total = seq.shape[1]
        width = total - self.seen
        if width <= 0:
            raise RuntimeError(f"{self.role} lane asked to advance rows that have nothing new")
        if total > self.capacity:
            raise RuntimeError(
                f"{self.role} FastLane holds {self.capacity} tokens but the sequence has {total}; build it with a "
                "larger capacity (the generation's max_length) or lower max_new_tokens."
            )
        first = self.seen == 0
        if first:
            self._start(mask)
        start = 0.0
        if self.timing:
            _sync(self.device)
            start = time.perf_counter()
        with torch.no_grad():
            logits, hidden = self._run(seq[:, total - width:].to(self.device), want_hidden)
        # copy out of the graph's buffers: the next replay (of either lane) may overwrite them
        logits = logits.to(device=seq.device, dtype=torch.float32, copy=True)
        hidden = hidden.clone() if hidden is not None else None
        seconds = None
        if self.timing:
            _sync(self.device)
            seconds = time.perf_counter() - start
        n_kv = max(self.seen - self.pads, 0)
        kind = CallKind.PREFILL if first else (CallKind.RESUME if bool(resumed[0]) else CallKind.DECODE)
        call = ForwardCall(self.role, kind, width - (self.pads if first else 0), n_kv, seconds)
        self.seen = total
        return logits, hidden, {0: call}

    def keep_rows(self, index: torch.Tensor) -> None:
        if index.tolist() != [0]:
            raise ValueError("FastLane holds one row; it cannot drop or reorder rows.")

    def reset(self) -> None:
        """Forget the sequence (keeps buffers and graphs): ready for the next generation."""
        self.cache.pos.zero_()
        self.valid.fill_(True)
        self.n_pad.zero_()
        self.seen = self.pads = self.long_calls = 0

    def warm_up(self, want_hidden: bool = False) -> float:
        """Capture (and compile) the one-token step and every bucket now rather than on first use,
        so that no later generation pays for it mid-way. Returns the seconds it took."""
        start = time.perf_counter()
        self.reset()
        with torch.no_grad():
            for size in sorted(set(self.buckets) | {1}):
                self._run(torch.ones(1, size, dtype=torch.long, device=self.device), want_hidden)
                self.cache.pos.zero_()  # dummy tokens: nothing to keep
        self.reset()
        _sync(self.device)
        return time.perf_counter() - start

    # ---- internals ----------------------------------------------------------------------------
    def _start(self, mask: torch.Tensor) -> None:
        """First call of a generation: note the prompt's left padding (one host sync)."""
        row = mask[0].cpu().bool()
        pads = int(row.long().argmax()) if bool(row.any()) else row.numel()
        if not bool(row[pads:].all()):
            raise ValueError("FastLane supports left padding only; the prompt's attention mask has holes.")
        self.pads = pads
        self.n_pad.fill_(pads)
        if pads:
            self.valid[:pads] = False

    def _gemv_plan(self, config: FastConfig) -> list:
        if config.gemv is False:
            return []
        if not gemv.available(self.device):
            if config.gemv:
                raise ValueError(f"FastConfig(gemv=True) needs Triton and a CUDA device (got {self.device}); "
                                 "install triton or leave gemv=None.")
            return []
        start = time.perf_counter()
        layers = gemv.plan(self.model, _GEMV_TABLE, fuse=config.fuse_qkv)
        self.gemv_tune_seconds = time.perf_counter() - start
        return layers

    def _run(self, new_ids: torch.Tensor, want_hidden: bool):
        width, top = new_ids.shape[1], self.config.max_bucket
        if width > top:  # longer than any bucket: whole largest buckets first, then the rest
            self.long_calls += 1
            head = (width - 1) // top * top  # leaves 1..top tokens for the last call
            for start in range(0, head, top):
                self._run_bucket(new_ids[:, start:start + top], False)
            return self._run_bucket(new_ids[:, head:], want_hidden)
        return self._run_bucket(new_ids, want_hidden)

    def _run_bucket(self, new_ids: torch.Tensor, want_hidden: bool):
        width = new_ids.shape[1]
        size = bucket_for(width, self.buckets)
        self.ids[:, :width].copy_(new_ids)
        n_real = 1
        if size > 1:
            self.n_real.fill_(width)
            n_real = self.n_real
        ids = self.ids[:, :size]
        if size == 1:
            fn = self._decode_step
        else:
            fn = self._compiled_bucket if size <= self.config.compile_max_bucket else self._forward
        step = lambda: fn(ids, n_real, want_hidden)  # noqa: E731
        key = (size, want_hidden)
        if self.graphs is not None and key in self.graphs:  # a replay runs no model code: no dispatch set-up
            return self.graphs.run(key, step)
        with self._model_code():
            return step() if self.graphs is None else self.graphs.run(key, step)

    @contextlib.contextmanager
    def _model_code(self):
        """Dispatch for the model's Python code: static-cache attention, tuned GEMV for one-row products."""
        with static_attention_on(self.model, self.config.attention), gemv.gemv_linears_on(self.gemv_layers):
            yield

    def _forward(self, ids: torch.Tensor, n_real, want_hidden: bool):
        """One forward over ``ids`` ``[1, q]`` whose first ``n_real`` tokens are real.

        ``n_real`` is an int when it is fixed for the call's shape, else a device scalar. Returns
        the logits ``[1, V]`` and hidden state ``[1, D]`` (or None) at the last real token.
        """
        q = ids.shape[1]
        kv = self.cache
        slots = kv.pos + self.slot_ids[:q]  # [q] slot = column of each token
        kv.slots = slots
        causal = self.slot_ids[None, :] <= slots[:, None]  # [q, S]
        own = self.slot_ids[None, :] == slots[:, None]  # a padding query sees itself: no empty rows
        allowed = causal & (self.valid[None, :] | own)
        positions = (slots - self.n_pad).clamp(min=0)[None, :]  # [1, q]
        fixed = isinstance(n_real, int)  # then n_real == q: keep the last position
        keep = 1 if fixed else (n_real - 1).reshape(1)  # tensor: index of the last real token
        out = self.model(
            input_ids=ids,
            attention_mask=allowed[None, None],  # 4D: transformers uses it as is
            position_ids=positions,
            use_cache=True,
            output_hidden_states=want_hidden,
            logits_to_keep=keep,
            **{self._cache_arg: kv},
        )
        kv.pos.add_(n_real)
        logits = out.logits[:, 0, : self.vocab]  # [1, V]
        hidden = None
        if want_hidden:
            last = out.hidden_states[-1]  # [1, q, D]
            hidden = last[:, -1] if fixed else last.index_select(1, keep)[:, 0]
        return logits, hidden
