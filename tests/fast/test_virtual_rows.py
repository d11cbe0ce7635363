"""The paged cache's addressing carries the design docs/serving.md calls *virtual rows* (not built yet): a row's token
``t`` lives where its block table and its padding count put it (``t = column - pad``), whichever cache row reads it.
So a one-column call whose extra cache rows copy a joiner's block-table row, each with the padding count that puts the
call's column on one of the joiner's prompt tokens, reads the whole prompt in that call: the joiner's last token gets
the logits, and its keys and values equal those of the prompt's prefill (every row of a layer stores before it
attends, so the prompt's tokens see each other causally). This test holds that property of PagedKV and the lane's
forward, on which the design relies: on the CPU in fp64 (eager attention; under Triton's interpreter, as the kernel
tier runs it, the cache's store kernel too), on CUDA in fp32 through the split attention and store kernels."""

import pytest
import torch

from hf_rstitch import Role
from hf_rstitch.fast import FastConfig, FastLane
from tiny_models import make_pair, prompt

CONFIG = FastConfig(max_bucket=16, graphs=False, paged=True)
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPE, ATOL = (torch.float32, 1e-4) if DEVICE == "cuda" else (torch.float64, 1e-12)


def _lane(llm) -> FastLane:
    return FastLane(llm, Role.LLM, 96, capacity=64, config=CONFIG, max_rows=16, kv_blocks=64)


def _row_kv(lane: FastLane, n: int) -> torch.Tensor:
    """Every layer's keys and values of cache row 0's first ``n`` tokens ``[2, layers, H_kv, n, D]`` (what the row
    holds; slots past its length, in blocks it has not reserved, are scratch that any padded write may touch)."""
    blocks = lane.cache.table[0].long()

    def tokens(pool):  # [n_blocks, H_kv, BLOCK, D] a layer -> [H_kv, n, D]
        return torch.stack([t[blocks].permute(1, 0, 2, 3).flatten(1, 2)[:, :n] for t in pool])

    return torch.stack([tokens(lane.cache.keys), tokens(lane.cache.values)])


@pytest.mark.cuda
@pytest.mark.parametrize("arch", ["llama", "qwen2", "gemma3"])
def test_a_prompt_read_as_virtual_rows_of_one_column_equals_its_prefill(arch):
    llm, _ = make_pair(arch)
    llm = llm.to(DEVICE, DTYPE)
    ids = prompt(9, seed=5)[0].to(DEVICE)
    n = ids.shape[0]
    whole = torch.ones(1, n, dtype=torch.long, device=DEVICE)

    ref = _lane(llm)
    ref.start(whole)
    ref.reserve(n)
    with torch.no_grad(), ref.model_code():  # the lane's kernels (split attention, store), as its calls run them
        want = ref.forward(ids[None], n, False)[0][0]

    lane = _lane(llm)  # row 0 reads its last token at column n - 1; rows 1..n-1 its tokens 0..n-2 there
    lane.start(whole)
    lane.reserve(n)
    column = n - 1
    lane.cache.table[1:n] = lane.cache.table[0]  # the virtual rows' blocks are row 0's
    lane.cache.pos.fill_(column)
    lane.n_pad[1:n] = torch.tensor([column - t for t in range(n - 1)], device=DEVICE)  # column - pad: its token
    lane.valid[:n] = torch.arange(lane.valid.shape[1], device=DEVICE)[None, :] >= lane.n_pad[:n, None]
    with torch.no_grad(), lane.model_code():
        got = lane.forward(torch.cat([ids[-1:], ids[:-1]])[:, None], 1, False)[0]

    torch.testing.assert_close(got[0], want, rtol=0, atol=ATOL)
    torch.testing.assert_close(_row_kv(lane, n), _row_kv(ref, n), rtol=0, atol=ATOL)
