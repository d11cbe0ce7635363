"""Joining rows' prefill for a :class:`~hf_rstitch.fast.lane.FastLane`: every row that joins a running batch in
one step is prefilled together, in batched calls of the lane's join twin, not one one-row call each.

A joining row must hold the keys and values of the shared columns the lane has read (``seen``) before the next
step reads the last ones with every other row (:meth:`~hf_rstitch.fast.lane.FastLane.add_rows`). The lane's
join twin (:meth:`Joins.twin`: the same model in the same kernels and graphs,
:data:`JOIN_ROWS` cache rows) runs them in groups of up to that many rows -- left-padded among themselves, the
columns that are padding in every row of a group skipped, rows of similar lengths grouped -- then each row's
slots are copied into its cache row. A group runs as one call per length bucket (a prompt longer than the
largest bucket as several), so a step with ``k`` joins costs ``ceil(k / rows)`` calls' worth of weight
reads instead of ``k`` (``rows``: :func:`default_rows`, 8 up to 32 with the batch, or the config's ``join_rows``).

Chunked joins (:class:`Stage`, the request engine's ``prefill_chunk``, :mod:`hf_rstitch.batching.chunked_prefill`): a
group of joining prompts is laid out in the join twin alone -- right-aligned in the group's own columns -- and
read a chunk of columns a step, at most a token budget a step (rows x columns, padding included), while the
batch goes on decoding; once every prompt but its last token is read, the rows join the batch and each copies
its slots to where its columns sit in the shared sequence (keys depend on positions, not slots).
"""

from __future__ import annotations

import dataclasses

import torch

from ..decode.lane import left_padding
from ..decode.step import to_device

JOIN_ROWS = 8  # rows the join twin prefills in one call at least (a static twin's cache holds this many rows)
MAX_JOIN_ROWS = 32  # a paged twin's rows at most (it holds no cache of its own: it borrows its lane's pool's blocks)


def default_rows(max_rows: int, paged: bool) -> int:
    """Rows a lane's join twin prefills in one call unless its config says (``FastConfig.join_rows``):
    :data:`JOIN_ROWS`; a paged lane's, an eighth of its batch within ``[JOIN_ROWS, MAX_JOIN_ROWS]``, so that the
    joiners of a step under load (a dozen at 256 rows with join pacing) take one call of each model, one weight
    read, instead of two or more. On an H200 serving a 7B / 1.5B pair at 256 clients, 32 rows against 8: 1.00x the
    LLM alone's tokens/s and 1.14x stitched's, joins' share of a step 17 % to 11 % and 36 % to 24 %
    (``engine_variants_nvidia_h200_join_rows256.md``); at 64 clients 16 rows against 8 were within the run's spread,
    so a batch of up to 64 rows keeps 8."""
    return min(MAX_JOIN_ROWS, max(JOIN_ROWS, max_rows // 8)) if paged else JOIN_ROWS


def prefill_rows(lane, dst: list[int], ids: torch.Tensor, host: torch.Tensor) -> int:
    """Fill ``lane``'s cache rows ``dst`` with the keys/values of ``ids`` ``[k, seen]`` (``host``: their mask, bool,
    on the CPU, left padding only). Returns the number of batched groups it ran. A row whose real columns all lie
    past ``seen`` (a lane that has not read the latest columns yet) has nothing to prefill: its slots are masked."""
    joiner = lane.joins.twin()
    pads = left_padding(host).tolist()
    order = sorted((i for i in range(len(dst)) if pads[i] < ids.shape[1]), key=lambda i: pads[i])  # similar lengths
    # share a group: less padding read
    groups = 0
    for start in range(0, len(order), joiner.max_rows):
        part = order[start:start + joiner.max_rows]
        at = torch.tensor(part, dtype=torch.long)
        run_group(joiner, ids[at], host[at])
        lane.cache.copy_rows(joiner.cache, list(range(len(part))), [dst[r] for r in part], lane.seen)
        groups += 1
    return groups


def chunk_columns(budget: int, rows: int, left: int, max_bucket: int) -> int:
    """Columns a group of ``rows`` rows reads this step: ``budget // rows`` (at least one), no more than ``left``,
    rounded down to whole ``max_bucket`` calls or a power of two below it (a graph's bucket: no padding read)."""
    cols = max(1, budget // rows)
    cols = cols // max_bucket * max_bucket if cols >= max_bucket else 1 << (cols.bit_length() - 1)
    return min(cols, left)


class Stage:
    """One group of joining prompts read in the join twin over several steps (the lane's ``stage_rows``).

    Layout: the ``g`` prompts right-aligned in ``width`` columns (the longest prompt's), in the twin's cache rows
    ``[0, g)``; the twin reads columns ``[first real column, width - 1)``: every prompt but its last token, which
    the batch's next step reads with every other row."""

    def __init__(self, joiner, prompts: list[list[int]]):
        self.joiner, self.lengths = joiner, [len(p) for p in prompts]
        self.width = width = max(self.lengths)
        host = torch.zeros(len(prompts), width, dtype=torch.bool)
        ids = torch.zeros(len(prompts), width, dtype=torch.long)
        for i, p in enumerate(prompts):
            ids[i, width - len(p):], host[i, width - len(p):] = torch.tensor(p, dtype=torch.long), True
        self.ids = to_device(ids, joiner.device)
        joiner.reset()  # nothing read: the longest prompt starts at column 0
        joiner.start(host)
        self.tokens = 0  # tokens read so far (rows x columns, padding included)

    @property
    def done(self) -> bool:
        return self.joiner.seen >= self.width - 1

    def advance(self, budget: int) -> bool:
        """Read the next chunk (at most ``budget`` tokens, at least one column) unless done; True once done."""
        j = self.joiner
        if not self.done:
            cols = chunk_columns(budget, len(self.lengths), self.width - 1 - j.seen, j.config.max_bucket)
            j.reserve(j.seen + cols)  # a paged joiner's blocks for the columns this chunk writes
            with torch.no_grad():
                j.run(self.ids[:, j.seen:j.seen + cols], False)
            j.seen += cols
            self.tokens += cols * len(self.lengths)
        return self.done

    def copy_into(self, lane, dst: list[int], staged: list[int], width: int) -> None:
        """Staged rows ``staged`` into ``lane``'s cache rows ``dst``, the shared sequence being ``width`` columns
        wide (each prompt right-aligned in it): the prompt columns ``lane`` has read, for each row."""
        for row, j in zip(dst, staged):
            n = self.lengths[j] - (width - lane.seen)  # the prompt's tokens before the lane's first unread column
            if n <= 0:
                continue
            if n > self.lengths[j] - 1 or not self.done:
                raise RuntimeError(f"{lane.role} FastLane: staged row {j} holds {self.joiner.seen} of its prompt's "
                                   f"columns; the batch needs {n} (join staged rows once their stage is done)")
            lane.cache.copy_slots(self.joiner.cache, j, self.width - self.lengths[j], row, width - self.lengths[j], n)


def run_group(joiner, ids: torch.Tensor, host: torch.Tensor) -> None:
    """``joiner`` (reset) reads ``ids`` ``[g, n]`` (mask ``host``, left-padded) into its cache rows ``[0, g)``: one
    batched catch-up from the first column that is real in some row (the padding columns before it count as
    read; the rows' own padding stays masked)."""
    joiner.reset()
    joiner.start(host)
    skip = min(left_padding(host).tolist())
    joiner.seen = skip
    joiner.cache.pos.fill_(skip)
    joiner.reserve(ids.shape[1])  # a paged joiner takes its rows' blocks from its lane's pool (handed over after)
    with torch.no_grad():
        joiner.run(to_device(ids[:, skip:], joiner.device), False)


class Joins:
    """The joins of ``lane``: a part the lane owns (``lane.joins``). Its join twin (:meth:`twin`), the prefill of
    a step's joining rows (:meth:`prefill`, counted in ``groups``) and the stage of chunked joins."""

    def __init__(self, lane):
        self.lane = lane
        self.built = None  # the join twin, once built (twin())
        self.stage: Stage | None = None  # joining prompts read over several steps in the twin
        self.groups = 0  # batched groups that prefilled joining rows, over the lane's life

    @property
    def room(self) -> int:
        """Prompts one stage holds (the join twin's rows: the config's ``join_rows``, else :func:`default_rows`)."""
        lane = self.lane
        rows = lane.rows.base  # the batch (a lane's spare rows for virtual joins do not count)
        return min(rows, lane.config.join_rows or default_rows(rows, lane.kv_pool is not None))

    def twin(self):
        """A lane of the same model and configuration with up to :attr:`room` rows (built on first use, kept):
        it prefills joining rows. It shares the lane's products (no second copy of the fused q/k/v weights) and the
        process's compiled pieces; its cache holds its rows (a paged lane's twin draws on the lane's pool and hands
        its blocks over)."""
        lane = self.lane
        if self.built is None:
            twin = type(lane)(lane.model, lane.role, lane.vocab, lane.capacity,
                              dataclasses.replace(lane.config, gemv=False), max_rows=self.room, kv_pool=lane.kv_pool)
            twin.kernels.products = lane.kernels.products
            twin.plan = dataclasses.replace(twin.plan, products=lane.plan.products, gemv_tiers=lane.plan.gemv_tiers,
                                            fuse_qkv=lane.plan.fuse_qkv, fuse_mlp=lane.plan.fuse_mlp)
            self.built = twin
        return self.built

    def prefill(self, dst: list[int], ids: torch.Tensor, host: torch.Tensor) -> None:
        """Fill the lane's cache rows ``dst`` with the keys/values of ``ids`` ``[k, seen]`` (:func:`prefill_rows`).

        Why not an eager forward: on a GPU that one forward per lane is host-bound, about ten decode steps' worth a
        joining row (``benchmarks/results/request_engine_*.md``). Refused while the twin holds a stage (its rows
        would be overwritten): the request engine joins rows whole only once a stage is joined or forgotten."""
        if self.stage is not None:
            raise RuntimeError(f"{self.lane.role} FastLane: rows join whole while the join twin holds a stage of "
                               "chunked joins, which their prefill would overwrite; join the staged rows (add_rows("
                               "..., staged=...)) or unstage() first")
        self.groups += prefill_rows(self.lane, dst, ids, host)

    def filler(self, seq: torch.Tensor, staged: list[int] | None):
        """``fill(free, host)`` for the lane's ``add_rows`` (:meth:`~hf_rstitch.fast.lane_rows.LaneRows.add`): the
        joining rows ``seq`` prefilled up to the lane's ``seen`` columns (:meth:`prefill`) or, with ``staged``, copied
        from these rows of the stage."""
        lane = self.lane

        def fill(free: list[int], host: torch.Tensor) -> None:
            if staged is None:
                self.prefill(free, seq[:, : lane.seen], host[:, : lane.seen])
            else:
                self.stage.copy_into(lane, free, staged, seq.shape[1])

        return fill

    def stage_rows(self, prompts: list[list[int]]) -> None:
        """Lay out joining prompts (at most :attr:`room`) in the twin, to be read over several steps."""
        if len(prompts) > self.room:
            raise ValueError(f"{self.lane.role} FastLane stages {self.room} prompts at once, got {len(prompts)}")
        self.stage = Stage(self.twin(), prompts)
