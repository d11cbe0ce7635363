"""The shared sequence of a lane's rows as the request engine keeps it, for tests that drive a
:class:`~hf_rstitch.fast.FastLane`'s continuous-batching verbs (rows join, leave, the columns grow and shrink on the
left) by hand."""

import torch

from hf_rstitch.fast import FastLane


class Batch:
    """The shared sequence as the request engine keeps it: ids and mask ``[B, T]``, left-padded."""

    def __init__(self, lane: FastLane, seed: int = 0):
        self.lane, self.g = lane, torch.Generator().manual_seed(seed)
        self.seq = torch.zeros(0, 0, dtype=torch.long)
        self.mask = torch.zeros(0, 0, dtype=torch.long)

    def tokens(self, rows: int, n: int) -> torch.Tensor:
        return torch.randint(3, 96, (rows, n), generator=self.g)

    def append(self, n: int = 1):
        """Every row gets ``n`` new tokens, then the lane advances (every row taking part)."""
        b = self.seq.shape[0]
        self.seq = torch.cat([self.seq, self.tokens(b, n)], 1)
        self.mask = torch.cat([self.mask, torch.ones(b, n, dtype=torch.long)], 1)
        everyone = torch.ones(b, dtype=torch.bool)
        return self.lane.advance(self.seq, self.mask, everyone, torch.zeros(b, dtype=torch.bool))

    def join(self, lengths: list[int]):
        width = max(lengths + [self.seq.shape[1]])
        grow = width - self.seq.shape[1]
        if grow:
            self.seq = torch.nn.functional.pad(self.seq, (grow, 0), value=2)
            self.mask = torch.nn.functional.pad(self.mask, (grow, 0), value=0)
            self.lane.pad_left(grow)
        seq = torch.full((len(lengths), width), 2)
        mask = torch.zeros(len(lengths), width, dtype=torch.long)
        for i, n in enumerate(lengths):
            seq[i, width - n:], mask[i, width - n:] = self.tokens(1, n)[0], 1
        self.lane.add_rows(seq, mask)
        self.seq, self.mask = torch.cat([self.seq, seq]), torch.cat([self.mask, mask])

    def hold(self, index: list[int]):
        """Rows ``index`` get no token this step (as the request engine's held rows: one column right)."""
        self.seq[index] = torch.nn.functional.pad(self.seq[index, :-1], (1, 0), value=2)
        self.mask[index] = torch.nn.functional.pad(self.mask[index, :-1], (1, 0), value=0)
        self.lane.hold_rows(index)

    def keep(self, index: list[int]):
        self.lane.keep_rows(torch.tensor(index))
        self.seq, self.mask = self.seq[index], self.mask[index]
        cut = int((self.mask == 0).long().cumprod(-1).sum(-1).min())
        self.lane.trim_left(cut)
        self.seq, self.mask = self.seq[:, cut:], self.mask[:, cut:]
        return cut

    def check(self, logits, model):
        with torch.no_grad():
            for r in range(self.seq.shape[0]):
                real = self.seq[r][self.mask[r].bool()]
                want = model(input_ids=real[None]).logits[0, -1, : self.lane.vocab]
                torch.testing.assert_close(logits[r], want.float(), rtol=1e-5, atol=1e-5)
