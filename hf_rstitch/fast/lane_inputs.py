"""What a :class:`~hf_rstitch.fast.lane.FastLane` call hands its graph besides the weights and the cache: a part the
lane owns (``lane.inputs``).

The graph's input buffer of token ids (``ids [max_rows, max_bucket]``: a call copies its new ids in, the graph reads
a fixed-shape view of it), the real-token count of a padded bucket (``n_real``, a device scalar the graph reads),
and, inside the forward, the attention mask and positions of the call's columns, built on the device from the
cache's write offset and each row's left-padding count (:meth:`StepInputs.layout`), so no call needs the host to
know where it writes. Views of the buffer are made once per shape: each slice costs the host about a microsecond.

What it does not do: choose the graph or run it (the lane does).
"""

from __future__ import annotations

import torch

from .buckets import bucket_for


class StepInputs:
    """The input buffers of a lane's calls: up to ``max_rows`` rows of up to ``max_bucket`` new tokens, over a cache
    of ``n_slots`` columns a row; ``buckets``: the lane's length buckets."""

    def __init__(self, max_rows: int, max_bucket: int, n_slots: int, buckets, device: torch.device):
        self.buckets = buckets
        self.slot_ids = torch.arange(n_slots, device=device)  # [S]
        self.ids = torch.zeros(max_rows, max_bucket, dtype=torch.long, device=device)  # graph input
        self.n_real = torch.ones((), dtype=torch.long, device=device)  # real tokens in a padded bucket
        self._views: dict[tuple, tuple] = {}  # (live rows, width, batch bucket) -> views of ids (place)

    def place(self, new_ids: torch.Tensor, bucket: int, index: torch.Tensor | None, placed=None):
        """Copy ``new_ids`` ``[B, width]`` into the buffer: of the live rows, in the batch bucket of ``bucket`` rows,
        cache row ``index[i]`` for row ``i`` (None: in order); or, with ``placed`` (bucket, their cache rows[, the
        live rows' width where ``new_ids`` is wider: :mod:`.virtual_rows`]), of those rows. Returns ``(bucket rows,
        length bucket, the graph's ids view, n_real)``: ``n_real`` an int where the length bucket has no padding, else
        the device scalar, filled."""
        live, width = new_ids.shape
        if placed is not None:
            rows, at, *real = placed
            size = bucket_for(width, self.buckets)
            self.ids[:, :width].index_copy_(0, at, new_ids)
            ids = self.ids[:rows, :size]
            width = real[0] if real else width  # virtual rows' chunks fill the bucket; the live rows read ``width``
        else:
            rows = bucket
            views = self._views.get((live, width, rows))
            if views is None:  # views of the graph's input buffer: made once a shape (each slice costs the host ~us)
                size = bucket_for(width, self.buckets)
                views = self._views[(live, width, rows)] = (size, self.ids[:live, :width], self.ids[:, :width],
                                                            self.ids[:rows, :size])
            size, into, wide, ids = views
            if index is None:
                into.copy_(new_ids)
            else:
                wide.index_copy_(0, index, new_ids)
        n_real = 1
        if size > 1:
            self.n_real.fill_(width)
            n_real = self.n_real
        return rows, size, ids, n_real

    def layout(self, pos: torch.Tensor, b: int, q: int, valid: torch.Tensor, n_pad: torch.Tensor,
               no_mask: torch.Tensor | None):
        """``(slots [q], allowed [b, q, S], positions [b, q])`` of a call of ``q`` tokens in cache rows ``[0, b)``
        written from offset ``pos``: the slot of each token (its column, the same in every row), the mask (causal,
        left padding hidden; ``no_mask``: the split kernel masks by pos and pad itself, a view and no kernel) and
        each row's positions (its column less its padding)."""
        slots = pos + self.slot_ids[:q]  # [q] slot = column of each token (the same in every row)
        if no_mask is not None:
            allowed = no_mask.expand(b, q, -1)
        else:
            causal = self.slot_ids[None, :] <= slots[:, None]  # [q, S]
            own = self.slot_ids[None, :] == slots[:, None]  # a padding query sees itself: no empty rows
            allowed = causal[None] & (valid[:b, None, :] | own[None])  # [b, q, S]
        positions = (slots[None, :] - n_pad[:b, None]).clamp(min=0)  # [b, q]
        return slots, allowed, positions
