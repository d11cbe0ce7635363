"""FastLane: a :class:`~hf_rstitch.decode.Lane` for CUDA, built for speed, at any batch size.

Same contract as ``Lane.advance`` -- bring every row of the batch up to date over the columns of
the shared sequence it has not seen, return the last column's logits -- with these changes underneath:

* a static KV cache (:class:`~hf_rstitch.fast.static_kv.StaticKV`) whose slot ``j`` holds
  column ``j`` of every row; the masks and positions of a step are built on the device from the
  write offset and each row's left-padding count, so no step needs the host to know where it writes;
  or, paged (``FastConfig(paged=True)``, ``kv_blocks=``; the request engine's), blocks a row owns as it
  writes, read through a device block table the host grows before each call (:mod:`hf_rstitch.fast.paged_kv`);
* every call of up to ``max_bucket`` tokens runs as a CUDA graph keyed by (batch bucket, length
  bucket): one-token decode steps, and catch-up prefills padded to a power-of-two bucket
  (:mod:`hf_rstitch.fast.buckets`); a batch runs in the graph of the smallest batch bucket holding
  its rows (:mod:`hf_rstitch.fast.rows`: finished rows stay as dead weight until the live ones fit
  a smaller bucket, then a few cache rows move). A longer catch-up (a long run of the other model,
  or a long prompt) runs as several calls of the largest bucket and one for the rest;
* attention reads only the slots written so far, in one split-K Triton kernel per layer
  (:mod:`hf_rstitch.fast.kernels.decode_attention`; ``FastConfig(attention="split")``, the default where
  Triton runs), not every slot of the static cache;
* one-row products of the linear layers run a Triton GEMV kernel tuned per weight shape on the
  device (:mod:`hf_rstitch.fast.kernels.gemv`; where Triton is installed), cuBLAS otherwise;
* optionally the step is compiled with ``torch.compile`` (fused elementwise kernels) before
  it is captured.

Per call the host does: one device copy of the new token ids into the graph's input buffer, a ``fill_`` of
the real-token count for padded buckets, one replay, one read-out of the logits from the graph's buffer (the
next replay of either lane overwrites it): on CUDA two small kernels that also find each row's entropy and
greedy token (:func:`~hf_rstitch.fast.kernels.fused_entropy.read_out`; :mod:`hf_rstitch.fast.lane_outputs`).
It never waits for the device except at the first call of a generation (the prompts' padding) and when rows
leave; the stitch loop's routing decision is the only other sync.

Padding: padded tokens are written to the slots just past the real ones, are invisible to
every real query (causal mask) and are overwritten by the next call before anything can
attend to them. Prompts may be left-padded; those slots are masked out of their row for good.

The lane is one class whose parts are objects it owns, each with its own small interface: ``lane.kv``
(:class:`~hf_rstitch.fast.lane_rows.LaneRows`: the cache, its rows' books, and the verbs rows leaving, joining,
waiting and the shared columns moving), ``lane.inputs`` (:class:`~hf_rstitch.fast.lane_inputs.StepInputs`: the
graphs' input buffers, and each call's mask and positions), ``lane.kernels``
(:class:`~hf_rstitch.fast.lane_build.LaneKernels`: what runs in place of the model's code), ``lane.outputs``
(:class:`~hf_rstitch.fast.lane_outputs.ReadOut`: the read-out and its entropy and greedy tokens), ``lane.ahead``
(:class:`~hf_rstitch.fast.lane_ahead.Ahead`: kernels built and graphs captured ahead), ``lane.joins``
(:class:`~hf_rstitch.fast.joins.Joins`: the join twin that prefills joining rows, and the stage of chunked joins)
and ``lane.virtual`` (:class:`~hf_rstitch.fast.virtual_rows.VirtualJoins`: joining prompts read in the next call).

Which of these a lane runs is decided once, when it is built, by :func:`~hf_rstitch.fast.plan.plan_for`:
``lane.plan`` (printable) names every kernel and patch, and the lane builds what it names.

Reuse: a lane keeps its graphs across generations (:meth:`reset`); graphs record the model's
weight addresses, so replace no parameter tensors of a model while a lane for it is alive
(in-place updates are fine). :class:`~hf_rstitch.fast.FastEngine` keeps lanes for reuse.
"""

from __future__ import annotations

import inspect
import time

import torch
from transformers import PreTrainedModel

from ..core.roles import Role
from . import joins
from .buckets import round_up
from .capabilities import profile_scope
from .config import FastConfig, check_supported
from .graphs import GraphRunner
from .kernels import rope_store
from .lane_ahead import Ahead
from .lane_build import LaneKernels, warn_eager
from .lane_compact import Compact, RowCounts
from .lane_inputs import StepInputs
from .lane_outputs import ReadOut
from .lane_rows import LaneRows
from .paged_kv import BlockPool
from .patches.products import product_layers
from .plan import plan_for
from .static_kv import KV_CHUNK
from .virtual_rows import VirtualJoins


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class FastLane:
    """One model with a static cache and captured steps, advanced over a shared sequence.

    Args:
        model: a full-attention causal LM (Llama, Qwen2, Mistral, ... family).
        role: :class:`Role.SLM` or :class:`Role.LLM`.
        vocab: logits are cut to this width.
        capacity: longest sequence (prompt + new tokens) the lane must hold.
        config: :class:`FastConfig`.
        timing: record device-synchronised seconds of each call in its ForwardCall (adds a sync).
        max_rows: most rows of a batch (cache rows); any batch up to it runs without rebuilding.
        kv_blocks: a paged cache (:mod:`hf_rstitch.fast.paged_kv`) of this many blocks; None: paged only with
            ``config.paged`` (then blocks for ``max_rows`` full rows), else a static cache.
        kv_pool: a paged cache over this pool (a lane's joiner shares its lane's).
        spare_rows: of ``max_rows``, the cache rows held beyond the batch for joins read as virtual rows
            (:mod:`.virtual_rows`): batch buckets of a few of them above the batch (:func:`.rows.batch_sizes`).
    """

    def __init__(self, model: PreTrainedModel, role: Role, vocab: int, capacity: int,
                 config: FastConfig | None = None, timing: bool = False, max_rows: int = 1,
                 kv_blocks: int | None = None, kv_pool: BlockPool | None = None, spare_rows: int = 0):
        check_supported(model, max_rows)
        self.config = config = config or FastConfig()
        self.model, self.role, self.vocab, self.timing = model, role, vocab, timing
        self.device = dev = model.device
        self.capacity = capacity
        n_slots = round_up(capacity + config.max_bucket, KV_CHUNK)  # padded writes stay inside; whole chunks
        self.kv = LaneRows(model, role, capacity, max_rows, n_slots, config.paged, kv_blocks, kv_pool, spare_rows)
        self.cache, self.rows, self.paged = self.kv.cache, self.kv.slots, self.kv.paged
        start = time.perf_counter()
        with profile_scope(config.profile):  # the GPU features its kernels and patches may use (.capabilities)
            self.plan = plan = plan_for(model, config, max_rows, self.cache.head_dim, spare_rows)  # every kernel
            # and patch it runs (the modules' probes included)
        self._plan_seconds = time.perf_counter() - start
        if self.paged:
            self.cache.gather = not plan.mask_free  # the split kernel reads the blocks, eager attentions a copy
        if config.graphs is None and not plan.graphs:
            warn_eager(dev)
        self.graphs = GraphRunner(dev) if plan.graphs else None  # raises off CUDA
        self._run_ahead = plan.run_ahead  # see decode.protocol
        self.buckets = plan.length_buckets
        self.inputs = StepInputs(max_rows, config.max_bucket, n_slots, self.buckets, dev)  # the graphs' input buffers
        self.ids, self.n_real = self.inputs.ids, self.inputs.n_real
        self.long_calls = 0  # calls of this generation longer than max_bucket (run as several bucket calls)
        self.record_only = False  # warm_up: a bucket whose kernels an earlier bucket ran, recorded without a run
        self.outputs = ReadOut(dev, self.kv)
        compact = config.compact_rows if config.compact_rows is not None else self.paged
        self.compact = Compact(self) if compact else None  # calls run only the rows they need (.lane_compact)
        self.kv.settle = self.compact is None  # rows that leave free their cache rows; no others move (keep)
        self.ran: torch.Tensor | None = None  # [B] bool CPU: the rows whose logits the last advance returned (compact)
        self.counts = RowCounts()  # rows run and rows needed over the lane's calls (row_counts)
        self.joins = joins.Joins(self)
        self.virtual = VirtualJoins(self)  # joins read in the next call as virtual rows (config.virtual_joins)
        self.ahead = Ahead(self)
        with profile_scope(config.profile):
            self._build_steps(n_slots, max_rows)

    def _build_steps(self, n_slots: int, max_rows: int) -> None:
        """The lane's steps as its plan names them: kernels built ahead, tuned products, the kernels and patches in
        place of the model's code, compiled steps; their host seconds in ``build_seconds``."""
        start = time.perf_counter()
        self.ahead.precompile()
        built = time.perf_counter()
        products = product_layers(self.model, self.config, max_rows)  # [] keeps cuBLAS everywhere
        self.gemv_tune_seconds = time.perf_counter() - start
        # where a lane's build went (host seconds): its plan (the modules' probes), kernels built ahead, the tuner's
        # timing and table look-ups;
        # FastEngine adds the whole build and the warm-up's captures
        self.build_seconds = {"plan": self._plan_seconds, "precompile": built - start,
                              "tune": start + self.gemv_tune_seconds - built}
        self.kernels = kernels = LaneKernels(self.model, self.plan, self.cache, self.kv.n_pad, n_slots, products)
        params = inspect.signature(self.model.forward).parameters
        self._cache_arg = "cache" if "cache" in params else "past_key_values"  # renamed in transformers 5.24
        self._decode_step, self._compiled_bucket = kernels.steps(self.forward)
        start = time.perf_counter()
        self.ahead.steps(kernels.deferrable, kernels.experts.kind is not None)  # before the probe's first launches
        self.build_seconds["steps_ahead"] = time.perf_counter() - start
        # rotation and cache store as one kernel a layer, for models whose layers allow it (rope_store)
        kernels.defer = kernels.deferrable and rope_store.defers_exactly(self.model, self._probe)

    # ---- the parts' state under the lane's names (the lane protocol, tests and the lab read these) -----------
    seen = property(lambda self: self.kv.seen, lambda self, n: setattr(self.kv, "seen", n),
                    doc="Columns of the shared sequence in the cache (every row).")
    valid = property(lambda self: self.kv.valid, doc="[rows, slots] False on left-padding slots.")
    n_pad = property(lambda self: self.kv.n_pad, doc="[rows] left-padding columns of each cache row.")
    row_moves = property(lambda self: self.kv.row_moves, doc="Cache rows moved down as finished rows left.")
    join_groups = property(lambda self: self.joins.groups, doc="Batched groups that prefilled joining rows.")
    kv_blocks = property(lambda self: self.kv.kv_blocks, doc="Blocks of a paged cache as asked for.")
    kv_pool = property(lambda self: self.kv.pool, doc="The BlockPool of a paged cache; None: a static cache.")
    gemv_layers = property(lambda self: self.kernels.products, doc="The tuned products' (module, forward) pairs.")
    ahead_error = property(lambda self: self.ahead.error, doc="Why the steps' kernels were not built ahead.")
    steps_marked = property(lambda self: self.ahead.marked, doc="The steps' kernels were in Triton's cache.")
    _attention = property(lambda self: self.kernels.attention)
    _experts = property(lambda self: self.kernels.experts)
    _no_mask = property(lambda self: self.kernels.no_mask)
    _rotary = property(lambda self: self.kernels.rotary)
    _rotary_tables = property(lambda self: self.kernels.rotary_tables)
    _qk_norms = property(lambda self: self.kernels.qk_norms)
    _defer = property(lambda self: self.kernels.defer)
    _join_lane = property(lambda self: self.joins.built)

    def _steps_signature(self, steps) -> str:
        return self.ahead.signature(steps)

    @property
    def max_rows(self) -> int:
        return self.rows.max_rows

    @property
    def run_ahead(self) -> bool:
        """The loop may call :meth:`advance` a step early (see :mod:`hf_rstitch.decode.protocol`); never while
        timing, whose calls wait for the device anyway."""
        return self._run_ahead and not self.timing

    @property
    def ahead_of_decisions(self) -> bool | None:
        """Whether the loop may go on before a routing decision reaches the host (see
        :func:`hf_rstitch.decode.step.decides_late`): the plan's ``ahead_of_decisions``."""
        return self.plan.ahead_of_decisions

    # ---- the Lane interface -------------------------------------------------------------------
    def advance(self, seq: torch.Tensor, mask: torch.Tensor, rows: torch.Tensor, resumed: torch.Tensor,
                want_hidden: bool = False, run: torch.Tensor | None = None):
        """As :meth:`hf_rstitch.decode.Lane.advance`: every row catches up columns ``[seen, T)``. A lane that runs only
        the rows a call needs (:attr:`compact`) brings the rows ``run`` (``[B]`` bool CPU; None: every row) up to
        date instead, and :attr:`ran` says which rows' logits it returns (:mod:`.lane_compact`)."""
        total = seq.shape[1]
        if self.compact is not None:
            return self.compact.call(seq, mask, rows, resumed, want_hidden, run)
        width = total - self.seen
        if width <= 0:
            raise RuntimeError(f"{self.role} lane asked to advance rows that have nothing new")
        self.kv.check(seq, mask, total)
        virtual = self.virtual.ready(width)  # kept joins ride in this call, or the join twin prefills them now
        self.kv.reserve(total)
        start = 0.0
        if self.timing:
            _sync(self.device)
            start = time.perf_counter()
        new = seq.narrow(1, total - width, width)  # [B, width] the columns not seen yet
        new = new if new.device == self.device else new.to(self.device)
        ids, placed = self.virtual.place(new) if virtual else (new, None)  # joiners' prompts as virtual rows
        self.counts.add(placed[0] if placed else self.rows.bucket, self.rows.n_live if run is None else int(run.sum()))
        try:
            with torch.no_grad():
                logits, hidden = self.run(ids, want_hidden, placed)
        finally:  # a failed call too: no table row but the joiner's may point at its blocks
            self.virtual.finish()
        # copy out of the graph's buffers: the next replay (of either lane) may overwrite them
        logits = self.outputs.read(logits, seq.device)
        hidden = self.kv.live(hidden).clone() if hidden is not None else None
        seconds = None
        if self.timing:
            _sync(self.device)
            seconds = time.perf_counter() - start
        calls = self.rows.records(self.role, total, rows.tolist(), resumed.tolist(), seconds)
        self.seen = total
        return logits, hidden, calls

    @property
    def row_counts(self) -> dict[str, int]:
        """Rows the lane's graphs ran and rows whose logits its callers needed, summed over its calls (its life)."""
        return self.counts.as_dict()

    def account(self, total: int, rows: torch.Tensor, resumed: torch.Tensor) -> dict:
        """The records an :meth:`advance` to ``total`` columns would have made for ``rows`` (``[B]`` bool CPU),
        for a call made early with no rows taking part (a run-ahead, whose rows were not known yet)."""
        return self.rows.records(self.role, total, rows.tolist(), resumed.tolist(), None)

    def crop(self, total: int) -> None:
        """Forget the columns past ``total`` (a guessed early call undone): :meth:`~.lane_rows.LaneRows.crop`."""
        self.virtual.flush("crop")  # kept joins read before the columns go back
        self.kv.crop(total)

    def entropy(self, logits: torch.Tensor) -> torch.Tensor:
        """As the lane protocol's: :meth:`~hf_rstitch.fast.lane_outputs.ReadOut.entropy`."""
        return self.outputs.entropy(logits)

    def greedy(self, logits: torch.Tensor) -> torch.Tensor | None:
        """As the lane protocol's: :meth:`~hf_rstitch.fast.lane_outputs.ReadOut.greedy`."""
        return self.outputs.greedy(logits)

    def reset(self) -> None:
        """Forget the sequence (keeps buffers and graphs; a paged cache's blocks go back to its pool): ready for the
        next generation."""
        self.virtual.forget()
        self.kv.reset()
        self.long_calls = 0
        self.outputs.last = None
        self.joins.stage = None

    def warm_up(self, want_hidden: bool = False, batch_sizes=None) -> float:
        """Capture (and compile) the one-token step and every length bucket, for each batch bucket in
        ``batch_sizes`` (default: all of this lane's), now rather than on first use, so that no later
        generation pays for it mid-way (:meth:`~.lane_ahead.Ahead.warm_up`). Returns the seconds it took."""
        return self.ahead.warm_up(want_hidden, batch_sizes)

    # ---- rows: the lane protocol's verbs beyond advance (lane.kv, .lane_rows) ------------------------------------
    def keep_rows(self, index: torch.Tensor) -> None:
        """As :meth:`~hf_rstitch.fast.lane_rows.LaneRows.keep`."""
        self.virtual.keep_rows(index)  # the kept joins that stay follow their rows

    def add_rows(self, seq: torch.Tensor, mask: torch.Tensor, staged: list[int] | None = None) -> None:
        """Append rows laid out in the shared columns (``seq`` / ``mask`` ``[k, T]``, left-padded) in free cache
        rows. Their first ``seen`` columns are prefilled now, all the step's joining rows together (logits
        discarded, as :meth:`hf_rstitch.decode.Lane.add_rows`), in batched calls of the join twin
        (:meth:`hf_rstitch.fast.joins.Joins.prefill`), or, with ``staged``, copied from these rows of the stage
        (:meth:`stage_rows`, read to the end); the rest is read at the next :meth:`advance`. With
        ``config.virtual_joins`` the join twin's part may instead ride in that call (:mod:`.virtual_rows`)."""
        self.kv.add(seq, mask, self.virtual.filler(self.joins.filler(seq, staged), seq, staged))

    def pad_left(self, n: int) -> None:
        """As :meth:`~hf_rstitch.fast.lane_rows.LaneRows.pad_left`."""
        seen = self.seen
        self.kv.pad_left(n)
        self.virtual.shifted(self.seen - seen)  # kept joins move with the columns

    def trim_left(self, n: int) -> None:
        """As :meth:`~hf_rstitch.fast.lane_rows.LaneRows.trim_left`."""
        if n > self.seen:  # columns not read yet go too: kept joins read before
            self.virtual.flush("trim")
        seen = self.seen
        self.kv.trim_left(n)
        self.virtual.shifted(self.seen - seen)  # kept joins move with the columns

    def hold_rows(self, index: list[int]) -> None:
        """As :meth:`hf_rstitch.decode.Lane.hold_rows` (:meth:`~hf_rstitch.fast.lane_rows.LaneRows.hold`)."""
        self.virtual.flush("hold", held=index)  # a kept join that waits is read before its columns move
        self.kv.hold(index)

    # ---- chunked joins: prompts read over several steps in the join twin before their rows join (lane.joins) ---
    @property
    def stage_room(self) -> int:
        """Prompts one stage holds (the join twin's rows)."""
        return self.joins.room

    def stage_rows(self, prompts: list[list[int]]) -> None:
        """Lay out joining prompts (at most :attr:`stage_room`) in the join twin, to be read over several steps
        (:meth:`prefill_staged`) while the batch decodes; they join with ``add_rows(..., staged=...)``."""
        self.virtual.flush("stage")  # kept joins read before the join twin takes the stage
        self.joins.stage_rows(prompts)

    def prefill_staged(self, budget: int) -> bool:
        """Read the staged prompts' next chunk (at most ``budget`` tokens, rows x columns); True once every
        prompt but its last token is read."""
        self.virtual.flush("stage")  # kept joins read before the join twin reads the stage
        return self.joins.stage.advance(budget)

    def unstage(self) -> None:
        """Forget the stage (its rows joined, or its requests went back to waiting)."""
        self.joins.stage = None

    # ---- steps ----------------------------------------------------------------------------------
    def start(self, mask: torch.Tensor) -> None:
        """First call of a generation: note each row's left padding (:meth:`~.lane_rows.LaneRows.start`)."""
        self.kv.start(mask)

    def reserve(self, total: int) -> None:
        """A paged cache: blocks for every live row's columns up to ``total`` (:meth:`~.lane_rows.LaneRows.reserve`)."""
        self.kv.reserve(total)

    def run(self, new_ids: torch.Tensor, want_hidden: bool, rows: tuple | None = None):
        """Read ``new_ids`` ``[B, width]`` of the live rows: bucket calls of up to ``max_bucket`` tokens; returns the
        graph's logits and hidden state (or None) at the last token (in the graph's buffers). ``rows``: (batch
        bucket, cache row of each row of ``new_ids``) for a call over some rows (:mod:`.lane_compact`); None: the
        live rows, in the bucket that holds them all."""
        with profile_scope(self.config.profile):  # launches (and captures) decide their features now
            return self._run_buckets(new_ids, want_hidden, *(() if rows is None else (rows,)))

    def _run_buckets(self, new_ids: torch.Tensor, want_hidden: bool, *rows):
        width, top = new_ids.shape[1], self.config.max_bucket
        if width > top:  # longer than any bucket: whole largest buckets first, then the rest
            self.long_calls += 1
            head = (width - 1) // top * top  # leaves 1..top tokens for the last call
            for start in range(0, head, top):
                self._run_bucket(new_ids[:, start:start + top], False, *rows)
            return self._run_bucket(new_ids[:, head:], want_hidden, *rows)
        return self._run_bucket(new_ids, want_hidden, *rows)

    def _run_bucket(self, new_ids: torch.Tensor, want_hidden: bool, placed=None):
        """One graph call over the batch bucket's rows; ``new_ids`` ``[B, width]`` of the live rows (or of the rows
        ``placed`` names: (bucket, their cache rows))."""
        rows, size, ids, n_real = self.inputs.place(new_ids, self.rows.bucket, self.kv.index, placed)
        if size == 1:
            fn = self._decode_step
        else:
            fn = self._compiled_bucket if size <= self.config.compile_max_bucket else self.forward
        step = lambda: fn(ids, n_real, want_hidden)  # noqa: E731
        key = (rows, size, want_hidden)
        if self.graphs is not None and key in self.graphs:  # a replay runs no model code: no dispatch set-up
            return self.graphs.run(key, step)
        with self.model_code():
            if self.graphs is not None and self.record_only:  # a warm-up's dummy call: nothing reads its outputs
                return self.graphs.record(key, step)
            return step() if self.graphs is None else self.graphs.run(key, step)

    def model_code(self, defer: bool | None = None, poison: bool = False):
        """Dispatch for the model's Python code, a context: what :meth:`~.lane_build.LaneKernels.installed` puts in
        place, the rotation put off to the cache's store with ``defer`` (default: this lane's choice)."""
        return self.kernels.running(self.role, defer, poison)

    _model_code = model_code  # the name tests and the lab stand in for

    def _probe(self, defer: bool, poison: bool) -> torch.Tensor:
        """Logits of one eager one-token forward in cache row 0 (for rope_store.defers_exactly); forgets it."""
        try:
            with torch.no_grad(), self.model_code(defer, poison):
                return self.forward(self.ids[:1, :1], 1, False)[0].float()
        finally:
            self.cache.pos.zero_()

    def forward(self, ids: torch.Tensor, n_real, want_hidden: bool):
        """One forward over ``ids`` ``[b, q]`` (cache rows ``[0, b)``) whose first ``n_real`` tokens are real.

        ``n_real`` is an int when it is fixed for the call's shape, else a device scalar. Returns
        the logits ``[b, V]`` and hidden state ``[b, D]`` (or None) at the last real token.
        """
        b, q = ids.shape
        kv = self.cache
        kv.slots, allowed, positions = self.inputs.layout(kv.pos, b, q, self.valid, self.n_pad, self.kernels.no_mask)
        fixed = isinstance(n_real, int)  # then n_real == q: keep the last position
        keep = 1 if fixed else (n_real - 1).reshape(1)  # tensor: index of the last real token
        out = self.model(
            input_ids=ids,
            attention_mask=allowed[:, None],  # 4D: transformers uses it as is
            position_ids=positions,
            use_cache=True,
            output_hidden_states=want_hidden,
            logits_to_keep=keep,
            **{self._cache_arg: kv},
        )
        kv.pos.add_(n_real)
        logits = out.logits[:, 0, : self.vocab]  # [b, V]
        hidden = None
        if want_hidden:
            last = out.hidden_states[-1]  # [b, q, D]
            hidden = last[:, -1] if fixed else last.index_select(1, keep)[:, 0]
        return logits, hidden
