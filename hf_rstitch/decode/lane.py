"""A lane: one model and its own KV cache, advanced over a shared token sequence.

All rows of the batch share one sequence tensor ``seq [B, T]`` (every row gains exactly one
token per step, whichever model wrote it). The lane remembers how many columns of that
sequence its cache already holds (``seen``). :meth:`Lane.advance` runs the model over exactly
the columns it has not seen -- the whole prompt the first time (prefill), the
other model's tokens after a switch (partial prefill, fused with producing the next token),
or the single previous token (decode) -- and returns the logits of the last column.

Batching: every call brings *every* row of the batch up to date, not only the rows whose next
token this model writes (the taking-part rows). Rows that do not take part catch up the tokens
the other model wrote for them, and their logits are ignored. A forward over ``[B, L]`` costs the
same whichever rows it is for, so this work is free: it fills what would otherwise be masked
padding, keeps every row of the cache at the same length, and shortens the catch-up a row needs
when it next takes part. So every row has seen the same columns, ``L`` is the same for all, and
the cache's slot mask is the sequence's own attention mask (0 only on left padding).

Sliding windows: rows are right-aligned (padding only on the left), so the distance between two
columns is the distance between the row's positions, and a window over the last ``W`` columns
is the row's own window over its last ``W`` tokens, padding masked. transformers' sliding
layers keep exactly those columns, so sliding-window and hybrid models batch like any other.

Rows joining a running batch (continuous batching, :mod:`hf_rstitch.batching.requests`):
:meth:`Lane.pad_left` prepends masked columns to every row (a prompt longer than the batch's
columns), :meth:`Lane.add_rows` appends rows whose first ``n_seen`` columns it prefills alone,
then merges into the cache; :meth:`Lane.trim_left` drops leading columns that are padding in
every row once the rows that needed them have left. :meth:`Lane.hold_rows` moves some rows one
column to the right (a masked column in front) when they gain no token at a step where the others
do (a schedule made them wait for the LLM, :mod:`hf_rstitch.core.scheduling`). Each edits the cache's layers
through :mod:`hf_rstitch.decode.cache_edits`.

Decode traces stay per row and *as if the row ran alone*: a row's :class:`ForwardCall` records
the tokens a solo run would read at that point (``n_inf``) and hold (``n_kv``), counted from
``solo_seen``, the columns a solo lane would have seen; ``seen`` is what the cache really holds.
At batch size 1 the two are equal.

R-Stitch never needs to shrink a cache: a discarded SLM proposal is a prediction, not an
input, so it never enters the SLM's cache. Finished rows are dropped with :meth:`keep_rows`.
"""

from __future__ import annotations

import inspect
import time

import torch
from transformers import DynamicCache, PreTrainedModel

from ..core.entropy import normalized_entropy
from ..core.roles import Role
from ..core.scheduling import Immediate, LLMSchedule, parse_schedule
from ..core.trace import ForwardCall, solo_calls
from .cache_edits import append_rows, drop_leading_columns, not_rewindable, prepend_columns, shift_rows_right


def left_padding(mask: torch.Tensor) -> torch.Tensor:
    """``[B]`` left-padding columns of each row of an attention mask ``[B, T]`` (zeros before the first one)."""
    return (mask == 0).long().cumprod(-1).sum(-1)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class Lane:
    """One model of the pair with its cache.

    Args:
        model: a causal LM.
        role: :class:`Role.SLM` or :class:`Role.LLM`.
        vocab: width of the shared vocabulary; logits are cut to it.
        batch_size: rows of the batch.
        timing: record device-synchronised wall seconds of every forward call.
    """

    run_ahead = False  # each call runs only the rows that take part (decode.protocol)
    ahead_of_decisions = False  # no run-ahead: nothing to guess before a decision reaches the host
    capacity = None  # a DynamicCache grows: no bound

    def __init__(self, model: PreTrainedModel, role: Role, vocab: int, batch_size: int = 1, timing: bool = False):
        self.model = model
        self.role = role
        self.vocab = vocab
        self.timing = timing
        self.device = model.device
        self.cache = DynamicCache(config=model.config)
        self.n_seen = 0  # columns of the shared sequence in the cache, the same for every row
        self.solo_seen = [0] * batch_size  # per row, columns in a solo run's cache (for the traces)
        self.pad: list[int] | None = None  # per row, left-padding columns, read at the first call
        self.dense = False  # no padding at all (set at the first call): see :meth:`_layout`
        self.mask: torch.Tensor | None = None  # [B, T] the sequence's attention mask at the last call (on device)
        self._rows = batch_size
        params = inspect.signature(model.forward).parameters
        self._keep_kwargs = {"logits_to_keep": 1} if "logits_to_keep" in params else {}
        self._cache_arg = "cache" if "cache" in params else "past_key_values"  # renamed in transformers 5.24

    @property
    def seen(self) -> torch.Tensor:
        """``[B]`` columns each row's cache holds (all equal: every call catches every row up)."""
        return torch.full((self._rows,), self.n_seen, dtype=torch.long)

    @property
    def slots(self) -> torch.Tensor:
        """``[B, S]`` mask of the cache's slots: the sequence's mask over the columns seen."""
        if self.mask is None:
            return torch.zeros(self._rows, 0, dtype=torch.long, device=self.device)
        return self.mask[:, : self.n_seen]

    def advance(
        self,
        seq: torch.Tensor,
        mask: torch.Tensor,
        rows: torch.Tensor,
        resumed: torch.Tensor,
        want_hidden: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None, dict[int, ForwardCall]]:
        """Run the model over every row's unseen columns; return next-token logits.

        Args:
            seq: ``[B, T]`` the whole sequence so far (prompt + new tokens), any device.
            mask: ``[B, T]`` attention mask of the sequence (0 on left padding).
            rows: ``[B]`` bool (CPU), the rows that take part in this call.
            resumed: ``[B]`` bool (CPU), the other model wrote the row's latest token(s).
            want_hidden: also return the last layer's hidden state at the last column.

        Returns:
            logits ``[B, vocab]`` float32 on ``seq``'s device (meaningful for taking-part rows),
            hidden ``[B, D]`` or None, and a :class:`ForwardCall` per taking-part row index,
            counted in that row's real tokens (as if it ran alone).
        """
        total, first = seq.shape[1], self.n_seen  # every row reads columns [first, total)
        if total <= first:
            raise RuntimeError(f"{self.role} lane asked to advance rows that have nothing new")
        if self.pad is None:  # the host reads of the mask, once; later records need no device sync
            self.pad = left_padding(mask).tolist()
            self.dense = self._padding_free(mask)
        mask = mask.to(self.device)

        out, seconds = self._forward(seq, mask, first, total, want_hidden, self._keep_kwargs)
        logits = out.logits[:, -1, : self.vocab].to(device=seq.device, dtype=torch.float32, copy=True)
        hidden = out.hidden_states[-1][:, -1, :] if want_hidden else None
        return logits, hidden, self._seen(total, mask, rows, resumed, seconds)

    def _forward(self, seq: torch.Tensor, mask: torch.Tensor, first: int, total: int, want_hidden: bool, keep: dict):
        """The model over columns ``[first, total)`` into the cache; (its output, device-synchronised seconds or None)."""
        start = 0.0
        if self.timing:
            _sync(self.device)
            start = time.perf_counter()
        out = self.model(
            input_ids=seq[:, first:].to(self.device),
            use_cache=True,
            output_hidden_states=want_hidden,
            **self._layout(mask, first, total),
            **{self._cache_arg: self.cache},
            **keep,
        )
        seconds = None
        if self.timing:
            _sync(self.device)
            seconds = time.perf_counter() - start
        return out, seconds

    def _seen(self, total: int, mask: torch.Tensor, rows: torch.Tensor, resumed: torch.Tensor, seconds):
        """After a call that read up to column ``total``: its records, and what the lane has seen."""
        taking = rows.tolist()
        calls = self._records(total, taking, resumed.tolist(), seconds)
        self.n_seen, self.mask = total, mask
        self.solo_seen = [total if take else seen for take, seen in zip(taking, self.solo_seen)]
        return calls

    # ---- speculative verification (hf_rstitch.decode.speculate) ----------------------------------
    def verify(self, seq: torch.Tensor, mask: torch.Tensor, n: int, rows: torch.Tensor, resumed: torch.Tensor):
        """As :meth:`advance`, but the logits of the last ``n`` columns: ``[B, n, vocab]`` float32 on ``seq``'s
        device (column ``T - n + i`` predicts column ``T - n + i + 1``), and the records. One forward."""
        total, first = seq.shape[1], self.n_seen
        if total - first < n:
            raise RuntimeError(f"{self.role} lane asked for the logits of {n} columns but has only {total - first} unseen")
        if self.pad is None:
            self.pad = left_padding(mask).tolist()
            self.dense = self._padding_free(mask)
        mask = mask.to(self.device)
        keep = {"logits_to_keep": n} if self._keep_kwargs else {}
        out, seconds = self._forward(seq, mask, first, total, False, keep)
        logits = out.logits[:, -n:, : self.vocab].to(device=seq.device, dtype=torch.float32, copy=True)
        return logits, self._seen(total, mask, rows, resumed, seconds)

    def keep_past(self) -> None:
        """Let :meth:`crop` roll back any call from now on: sliding-window and linear-attention layers keep the
        states they would drop (until the next crop) instead of dropping them."""
        self.cache.activate_past_recording()
        self._past = True

    def crop(self, n_seen: int) -> None:
        """Forget the columns from ``n_seen`` on (speculative tokens the LLM rejected): the cache holds the first
        ``n_seen`` columns again. Needs :meth:`keep_past` before the calls it rolls back."""
        drop = self.n_seen - n_seen
        if drop < 0:
            raise ValueError(f"{self.role} lane: cannot crop to {n_seen} columns, it has seen only {self.n_seen}")
        if not getattr(self, "_past", False):
            raise RuntimeError(f"{self.role} lane: crop needs keep_past() before the calls it rolls back")
        why = not_rewindable(self.cache) if drop else None
        try:
            if why is None:
                self.cache.crop(-drop)  # also trims the kept past of sliding / linear layers back to what they need
        except (TypeError, RuntimeError, ValueError) as err:
            why = f"its cache's crop fails ({type(err).__name__}: {err})"
        if why is not None:
            raise ValueError(f"{self.role} lane: cannot roll back {drop} speculative columns of "
                             f"{type(self.model).__name__}: {why}. Drop stitch_speculate for this model.")
        self.n_seen = n_seen
        self.solo_seen = [min(s, n_seen) for s in self.solo_seen]
        if self.mask is not None:
            self.mask = self.mask[:, :n_seen]

    @staticmethod
    def _padding_free(mask: torch.Tensor) -> bool:
        """No masked column at all: every later call can take the fast layout (tests force it off here)."""
        return bool(mask.all())

    def _layout(self, mask: torch.Tensor, first: int, total: int) -> dict[str, torch.Tensor]:
        """Attention mask and position ids of columns ``[first, total)``.

        Without padding (``dense``) the mask is all ones and the positions are the column indices:
        the model gets no mask and builds the same causal mask itself, skipping the padding checks
        (about 25 us a call on CPU, which a ~1 ms small-model step notices).
        """
        if self.dense:
            return {"position_ids": torch.arange(first, total, device=self.device).expand(self._rows, -1)}
        positions = (mask.long().cumsum(-1) - 1).clamp_(min=0)  # [B, T]; 0 on left padding
        return {"attention_mask": mask, "position_ids": positions[:, first:]}

    def _records(self, total: int, taking: list[bool], resumed: list[bool], seconds):
        """Per taking-part row, the call a solo run would make (:func:`~hf_rstitch.core.trace.solo_calls`)."""
        return solo_calls(self.role, total, taking, self.solo_seen, self.pad, resumed, seconds)

    def keep_rows(self, index: torch.Tensor) -> None:
        """Keep only the rows ``index`` (CPU long tensor), e.g. to drop finished rows."""
        self.cache.batch_select_indices(index)  # a CPU index serves layers on any device (device_map)
        self._rows = len(index)
        if self.mask is not None:
            self.mask = self.mask[index.to(self.device)]
        keep = index.tolist()
        self.solo_seen = [self.solo_seen[i] for i in keep]
        if self.pad is not None:
            self.pad = [self.pad[i] for i in keep]

    def entropy(self, logits: torch.Tensor) -> torch.Tensor:
        """``[B]`` float32 normalized entropy of ``logits`` ``[B, vocab]``."""
        return normalized_entropy(logits)

    def greedy(self, logits: torch.Tensor) -> None:
        """None: the eager lane finds no argmax on the way (the caller computes it)."""
        return None

    def reset(self) -> None:
        """Forget everything seen: an empty cache for a new generation of ``batch_size`` rows."""
        self.__init__(self.model, self.role, self.vocab, self._rows, timing=self.timing)

    # ---- rows joining a running batch (continuous batching) ---------------------------------------
    def add_rows(self, seq: torch.Tensor, mask: torch.Tensor) -> None:
        """Append rows laid out in the shared columns: ``seq`` / ``mask`` ``[k, T]``, left-padded.

        Their first ``n_seen`` columns are prefilled now (alone, logits discarded) and merged into
        the cache, so every row again holds the same columns; the rest is read at the next
        :meth:`advance`. Their trace records count from nothing seen, as in a solo run.
        """
        k = seq.shape[0]
        pads = left_padding(mask).tolist()
        if self.n_seen == 0:
            self.cache = DynamicCache(config=self.model.config)  # nothing seen: a fresh cache of the new width
        else:
            fresh = DynamicCache(config=self.model.config)
            part = mask[:, : self.n_seen].to(self.device)
            positions = (part.long().cumsum(-1) - 1).clamp_(min=0)
            with torch.no_grad():
                self.model(input_ids=seq[:, : self.n_seen].to(self.device), attention_mask=part,
                           position_ids=positions, use_cache=True, **{self._cache_arg: fresh}, **self._keep_kwargs)
            append_rows(self.cache, fresh)
        if self.mask is not None:
            self.mask = torch.cat([self.mask, mask[:, : self.mask.shape[1]].to(self.mask.device)], dim=0)
        if self.pad is not None:
            self.pad += pads
        self.dense = self.dense and bool(mask.all())
        self.solo_seen += [0] * k
        self._rows += k

    def pad_left(self, n: int) -> None:
        """Prepend ``n`` masked columns to every row (the shared sequence grew on the left)."""
        if n <= 0:
            return
        if self.n_seen > 0:
            prepend_columns(self.cache, n)
            self.n_seen += n
            self.mask = torch.nn.functional.pad(self.mask, (n, 0), value=0)
        if self.pad is not None:
            self.pad = [p + n for p in self.pad]
        self.solo_seen = [s + n for s in self.solo_seen]
        self.dense = False

    def hold_rows(self, index: list[int]) -> None:
        """Rows ``index`` gain no token this step while the others gain one.

        The shared sequence grows by one column; for these rows it is a masked column in front (their
        columns move one to the right, so they stay right-aligned). In the cache their slots move right
        too and the last one falls off: that column -- now the last one seen -- is read again at the next
        call, so every row still holds the same columns. Full-attention models only: a sliding layer
        keeps too few columns to move (:func:`check_holdable`).
        """
        if not index or self.n_seen == 0:  # nothing cached: the next call reads the padding from the mask
            return
        at = torch.tensor(index, dtype=torch.long)
        shift_rows_right(self.cache, at, self.role)
        rows = at.to(self.mask.device)
        self.mask[rows] = torch.nn.functional.pad(self.mask[rows, :-1], (1, 0), value=0)
        for r in index:
            self.pad[r] += 1
            self.solo_seen[r] += 1
        self.dense = False

    def trim_left(self, n: int) -> None:
        """Drop the first ``n`` columns of the shared sequence, which must be padding in every row."""
        if n <= 0:
            return
        if self.pad is not None and n > min(self.pad, default=n):
            raise ValueError(f"{self.role} lane: cannot trim {n} columns, some row has only {min(self.pad)} of padding")
        cut = min(n, self.n_seen)  # columns past n_seen are not in the cache yet
        drop_leading_columns(self.cache, cut)
        if self.mask is not None:
            self.mask = self.mask[:, cut:]
        self.n_seen -= cut
        self.pad = [p - n for p in self.pad] if self.pad is not None else None
        self.solo_seen = [max(s - n, 0) for s in self.solo_seen]


def check_holdable(model: PreTrainedModel) -> None:
    """Raise unless rows of ``model`` can wait (:meth:`Lane.hold_rows`): full attention only."""
    config = model.config.get_text_config()
    kinds = set(getattr(config, "layer_types", None) or ["full_attention"])
    if kinds != {"full_attention"} or getattr(config, "use_sliding_window", False) and getattr(config, "sliding_window", None):
        raise ValueError(f"waiting for the LLM (schedule='gather') needs full-attention models; {type(model).__name__} has "
                         f"layer types {sorted(kinds)} (sliding_window={getattr(config, 'sliding_window', None)}): a "
                         "sliding layer keeps too few columns to move a waiting row. Use the default schedule.")


def checked_schedule(spec, llm, slm) -> LLMSchedule | None:
    """The engine's schedule (None: the LLM runs at once); waiting needs full-attention models."""
    schedule = parse_schedule(spec) if spec is None or isinstance(spec, str) else spec
    if not hasattr(schedule, "run_now"):
        raise TypeError(f"schedule must be None, a string such as 'gather:2:8' or an object with run_now(demand), "
                        f"got {type(spec).__name__}")
    if isinstance(schedule, Immediate):
        return None
    check_holdable(llm)
    check_holdable(slm)
    return schedule
