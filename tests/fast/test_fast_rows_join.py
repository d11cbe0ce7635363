"""FastLane's continuous-batching verbs (rows join, the shared columns grow and shrink on the left):
after every step each live row's logits equal a plain forward over that row's real tokens alone,
and an added row's calls are counted as in its solo run. CPU, fp64 tiny models, no graphs."""

import pytest
import torch

from hf_rstitch import Role
from hf_rstitch.core.trace import CallKind
from hf_rstitch.fast import FastConfig, FastLane
from tiny_models import make_pair

CPU = FastConfig(max_bucket=4, graphs=False)


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


def test_rows_join_and_leave_and_match_their_solo_forwards():
    llm, _ = make_pair("qwen2-full")
    lane = FastLane(llm, Role.LLM, 96, capacity=64, config=CPU, max_rows=4)
    b = Batch(lane)
    b.join([5, 3])  # nothing seen yet: the first advance reads both prompts
    logits, _, calls = b.append(1)
    b.check(logits, llm)
    assert [(c.kind, c.n_inf, c.n_kv) for c in calls.values()] == [(CallKind.PREFILL, 6, 0), (CallKind.PREFILL, 4, 0)]
    b.check(b.append(2)[0], llm)
    b.join([11])  # longer than the 8 shared columns: 3 masked columns in front of the first two rows
    assert b.seq.shape[1] == 11 and lane.seen == 11
    logits, _, calls = b.append(1)
    b.check(logits, llm)
    assert calls[2].kind is CallKind.PREFILL and (calls[2].n_inf, calls[2].n_kv) == (12, 0)  # as if alone
    assert (calls[0].kind, calls[0].n_inf, calls[0].n_kv) == (CallKind.DECODE, 1, 8)
    b.join([2])  # a short one: no new columns, a fourth cache row
    b.check(b.append(3)[0], llm)
    assert b.keep([0, 1, 3]) == 3  # the long row leaves; the 3 columns of padding all others share go
    b.check(b.append(1)[0], llm)
    b.join([6])  # fills the freed cache row: max_rows = 4 live rows
    assert sorted(lane.rows.slot) == [0, 1, 2, 3]
    b.check(b.append(2)[0], llm)
    with pytest.raises(ValueError, match="holds 4 rows, 4 are live: no room for 1 more"):
        b.join([3])
