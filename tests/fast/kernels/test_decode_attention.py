"""The split-K static-cache attention kernel (hf_rstitch.fast.kernels.decode_attention) against a plain reference.

On CPU the kernel runs only under Triton's interpreter (``TRITON_INTERPRET=1`` with triton
installed); these tests skip when it is not there. On CUDA they run the compiled kernel.
"""

import pytest
import torch

from hf_rstitch.fast.kernels import decode_attention as da
from hf_rstitch.fast.kernels import gemv

DEVICES = [d for d, ok in (("cpu", gemv.available("cpu")),
                           ("cuda", torch.cuda.is_available() and gemv.available("cuda"))) if ok]
pytestmark = pytest.mark.skipif(not DEVICES, reason="needs triton (CUDA, or TRITON_INTERPRET=1 on CPU)")


def reference(query, key, value, pos, pads, scale, window=None, softcap=None, sinks=None):
    """Eager attention in float64: query i of row b sits at slot pos + i and sees slots <= its own,
    except the row's first pads[b] slots (left padding), its own slot always; with a window, only slots
    > pos + i - window (transformers' sliding_window_overlay); softcap caps the scaled scores; sinks (one
    logit a head) join the softmax as an extra column that is then dropped (gpt-oss's eager attention)."""
    batch, heads, q, dim = query.shape
    group = heads // key.shape[1]
    k = key.double().repeat_interleave(group, dim=1)[:, :, : pos + q]
    v = value.double().repeat_interleave(group, dim=1)[:, :, : pos + q]
    slot = torch.arange(pos + q, device=query.device)
    mine = pos + torch.arange(q, device=query.device)
    pad = torch.tensor(pads, device=query.device)
    see = (slot[None, None, :] <= mine[None, :, None]) & (
        (slot[None, None, :] >= pad[:, None, None]) | (slot[None, None, :] == mine[None, :, None]))  # [b, q, S]
    if window is not None:
        see = see & (slot[None, None, :] > mine[None, :, None] - window)
    scores = (query.double() @ k.transpose(2, 3)) * scale
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    scores = scores.masked_fill(~see[:, None], float("-inf"))
    if sinks is not None:
        sink = sinks.double().reshape(1, heads, 1, 1).expand(batch, heads, q, 1)
        probs = torch.cat([scores, sink], dim=-1).softmax(-1)[..., :-1]
    else:
        probs = scores.softmax(-1)
    return (probs @ v).transpose(1, 2)  # [b, q, H, D]


def _check(device, batch, heads, kv_heads, q, dim, slots, pos, pads):
    """The kernels' output for random queries and cache (NaN past the written slots: never read) equals the
    float64 reference."""
    query = torch.randn(batch, q, heads, dim, device=device).transpose(1, 2)
    key = torch.randn(batch, kv_heads, slots, dim, device=device)
    value = torch.randn(batch, kv_heads, slots, dim, device=device)
    key[:, :, pos + q:] = float("nan")
    value[:, :, pos + q:] = float("nan")
    out, _ = da.decode_attention(None, query, key, value, None, scaling=0.3, pos=torch.tensor(pos, device=device),
                                 pad=torch.tensor(pads, device=device), fallback=None)
    torch.testing.assert_close(out.double(), reference(query, key, value, pos, pads, 0.3), atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("batch,heads,kv_heads,q,dim,slots,pos,pads", [
    (1, 8, 2, 1, 32, 512, 37, [0]),  # B = 1 decode step
    (3, 7, 1, 1, 16, 320, 200, [0, 5, 199]),  # group of 7 (Qwen2-7B), a row that is all padding but its own slot
    (4, 12, 2, 2, 64, 256, 64, [3, 0, 0, 60]),  # two-token catch-up, split boundary at the write offset
    (2, 8, 2, 8, 32, 448, 100, [10, 0]),  # 32 rows per KV head: two row blocks of 16
    (2, 4, 4, 13, 16, 640, 511, [0, 7]),  # a padded-bucket shape crossing many splits
])
def test_kernel_equals_reference(device, batch, heads, kv_heads, q, dim, slots, pos, pads):
    torch.manual_seed(batch + q + pos)
    query = torch.randn(batch, q, heads, dim, device=device).transpose(1, 2)  # as transformers lays it out
    key = torch.randn(batch + 1, kv_heads, slots, dim, device=device)[:batch]  # cache rows past the bucket unused
    value = torch.randn(batch + 1, kv_heads, slots, dim, device=device)[:batch]
    key[:, :, pos + q:] = float("nan")  # slots not written yet: never read
    value[:, :, pos + q:] = float("nan")
    posd = torch.tensor(pos, device=device)
    pad = torch.tensor(pads + [123], device=device)  # one entry per cache row
    out, weights = da.decode_attention(None, query, key, value, None, scaling=0.3, pos=posd, pad=pad,
                                       fallback=None)
    assert weights is None and out.shape == (batch, q, heads, dim)
    want = reference(query, key, value, pos, pads, 0.3)
    torch.testing.assert_close(out.double(), want, atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize("device", DEVICES)
def test_unsupported_shapes_take_the_fallback(device):
    query = torch.randn(1, 4, 1, 24, device=device)  # head size 24: not a power of two
    key = torch.randn(1, 2, 64, 24, device=device)
    seen = []

    def fallback(module, q, k, v, mask, **kw):
        seen.append(q.shape)
        return "fallback", None

    assert da.decode_attention(None, query, key, key, None, pos=torch.tensor(0), pad=torch.zeros(1, dtype=torch.long),
                               fallback=fallback)[0] == "fallback"
    assert seen == [query.shape]


def test_plan_fills_the_device_and_caps_the_splits():
    # 4 programs a split: FILL x 132 would want 66 splits; capped at MAX_SPLITS (16), or at the blocks of
    # SPLIT_BLOCK_N (64) slots the cache holds (640 slots: 10)
    assert da._plan(batch=1, kv_heads=4, rows=7, slots=3072, sms=132) == (16, 1, da.MAX_SPLITS, da.SPLIT_BLOCK_N,
                                                                          da.SPLIT_STAGES)
    assert da._plan(batch=1, kv_heads=4, rows=7, slots=640, sms=132).splits == 640 // da.SPLIT_BLOCK_N == 10
    assert da._plan(batch=8, kv_heads=4, rows=7, slots=3072, sms=132).splits == 9  # 32 programs, 9 x 32 >= 264
    # 256 programs are ~2 waves on 132 SMs: one split, its own block and pipeline depth
    assert da._plan(batch=64, kv_heads=4, rows=56, slots=3072, sms=132) == (64, 1, 1, da.ONE_BLOCK_N, da.ONE_STAGES)
    assert da._plan(1, 1, 1, 100000, 132).splits == da.MAX_SPLITS
    assert da._plan(8, 4, 7, 40, 132).splits == 1  # a cache shorter than a block: one split


def test_splits_share_the_written_slots():
    """The split length follows the written length, not the capacity: at 300 written slots and 5 splits
    (B = 64 on an H200) each split reads 64 slots, so all five work; whole BLOCK_N steps, every slot
    covered, no split past the written ones but the last's remainder."""
    assert da.split_length(300, 5, 64) == 64
    assert da.split_length(3000, 5, 64) == 640
    assert da.split_length(1, 48, 64) == 64
    for total in (1, 63, 64, 65, 300, 1400, 2881, 4096):
        for n in (1, 5, 24, 48, 64):
            length = da.split_length(total, n, 64)
            assert length % 64 == 0 and length * n >= total and length - 64 < -(-total // n)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("in_split", [True, False])
@pytest.mark.parametrize("batch,q,pos", [(1, 1, 3000), (2, 3, 1500)])
def test_many_splits_combine_in_chunks(device, batch, q, pos, in_split, monkeypatch):
    """A device with many SMs: up to 64 splits, of which dozens hold written slots; the combine reads them a
    chunk at a time (more than one chunk here), in the split kernel's last program (``COMBINE_IN_SPLIT``, its
    tickets back to zero afterwards) or in a kernel of its own."""
    monkeypatch.setattr(da, "COMBINE_IN_SPLIT", in_split)
    monkeypatch.setattr(da, "_sm_count", lambda device: 132)
    heads, kv_heads, dim, slots = 4, 2, 16, 4096
    block_m, _, splits, block_n, _ = da._plan(batch, kv_heads, heads // kv_heads * q, slots, 132)
    split = da.split_length(pos + q, splits, block_n)
    assert -(-(pos + q) // split) > 128 // block_m  # more written splits than one chunk holds
    torch.manual_seed(pos)
    pads = [0, 40][:batch]
    _check(device, batch, heads, kv_heads, q, dim, slots, pos, pads)
    if in_split:
        where = str(torch.empty(0, device=device).device)  # "cuda:0", as the kernel's tensors name it
        assert not da._TICKETS[where].any()  # every combining program gave its ticket back


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("basis", ["written", "capacity"])
@pytest.mark.parametrize("q,pos", [(1, 200), (4, 61), (1, 0)])
def test_short_sequence_in_a_long_cache_works_in_every_split(device, q, pos, basis, monkeypatch):
    """A few hundred written slots in a cache of thousands (early in a long generation): the written slots
    are shared among all the planned splits, the rest of the cache (NaN here) is never read. The earlier
    plan (splits share the capacity), kept to measure against, gives the same output."""
    monkeypatch.setattr(da, "_sm_count", lambda device: 132)
    monkeypatch.setattr(da, "SPLIT_BASIS", basis)
    batch, heads, kv_heads, dim, slots = 8, 4, 2, 16, 3072
    _, _, splits, block_n, _ = da._plan(batch, kv_heads, heads // kv_heads * q, slots, 132)
    written = da.split_length(pos + q, splits, block_n)
    assert splits > 1 and -(-(pos + q) // written) == min(splits, -(-(pos + q) // block_n))
    torch.manual_seed(pos + q)
    pads = [0, 3, 0, 0, 5, 0, 0, 1] if pos > 8 else [0] * batch
    _check(device, batch, heads, kv_heads, q, dim, slots, pos, pads)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("batch,q,pos", [(3, 1, 150), (2, 4, 70)])
def test_one_split_writes_the_output_itself(device, batch, q, pos, monkeypatch):
    """Where the rows alone fill the device (ONE_SPLIT waves), one split per row and KV head: the split
    kernel normalizes and writes the output, no combine runs; same output as the reference."""
    monkeypatch.setattr(da, "_sm_count", lambda device: 4)
    monkeypatch.setattr(da, "ONE_SPLIT", 1.0)
    heads, kv_heads, dim, slots = 6, 2, 16, 256
    assert da._plan(batch, kv_heads, heads // kv_heads * q, slots, 4).splits == 1
    monkeypatch.setattr(da, "ONE_SPLIT", 99.0)
    assert da._plan(batch, kv_heads, heads // kv_heads * q, slots, 4).splits > 1
    monkeypatch.setattr(da, "ONE_SPLIT", 1.0)
    torch.manual_seed(pos)
    pads = [0, 7, 2][:batch]
    _check(device, batch, heads, kv_heads, q, dim, slots, pos, pads)



@pytest.mark.parametrize("device", DEVICES)
def test_steps_that_build_no_mask_equal_those_that_do(device):
    """A float32 pair, a left-padded batch through generate: the split attention's lanes pass a mask they do
    not compute (the kernel masks by write offset and padding); the matmul attention builds and reads it."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from hf_rstitch import ReplayPolicy
    from hf_rstitch.fast import FastConfig, FastEngine
    from tiny_models import prompt

    def qwen2(hidden, heads, layers, seed):  # head size 16: the kernel's smallest
        torch.manual_seed(seed)
        config = Qwen2Config(vocab_size=96, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                             num_attention_heads=heads, num_key_value_heads=heads // 2, max_position_embeddings=128)
        return Qwen2ForCausalLM(config).float().to(device).eval()

    llm, slm = qwen2(64, 4, 2, 0), qwen2(32, 2, 1, 1)
    ids = torch.cat([prompt(9, seed=1), prompt(9, seed=2)]).to(device)
    mask = torch.ones_like(ids)
    mask[1, :4] = 0  # the second row is a 5-token prompt, left-padded
    route = ["slm"] * 3 + ["llm"] * 2 + ["slm"] * 3
    outs = []
    for attention in ("split", "matmul"):
        engine = FastEngine(FastConfig(max_bucket=4, graphs=device == "cuda", attention=attention), max_batch=2)
        outs.append(llm.generate(ids, attention_mask=mask, assistant_model=slm, stitch_policy=ReplayPolicy(route),
                                 stitch_engine=engine, max_new_tokens=len(route), min_new_tokens=len(route),
                                 return_dict_in_generate=True, output_logits=True))
        lane = engine._lanes[next(iter(engine._lanes))]
        assert (lane._no_mask is not None) == (attention == "split")
    assert torch.equal(outs[0].sequences, outs[1].sequences)
    for a, b in zip(outs[0].logits, outs[1].logits):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)


class _Layer:
    """Stands in for an attention layer: the window check reads its layer_idx."""

    def __init__(self, layer_idx):
        self.layer_idx = layer_idx


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("one_split", [False, True])
@pytest.mark.parametrize("batch,q,pos,window,softcap,sinks", [
    (1, 1, 300, 37, None, False),  # a decode step far past the window: the splits share its 37 slots
    (3, 4, 150, 8, None, False),  # a catch-up of 4 whose queries see different slots; windows of 8 < BLOCK_N
    (2, 1, 6, 100, None, False),  # a window longer than the sequence: as without one
    (2, 3, 250, 70, 5.0, False),  # soft-capped scores (Gemma 2)
    (2, 2, 200, 64, None, True),  # sinks (gpt-oss)
    (1, 1, 90, None, 2.0, True),  # a full-attention layer with both
])
def test_windows_softcap_and_sinks_equal_the_reference(device, one_split, batch, q, pos, window, softcap, sinks,
                                                        monkeypatch):
    """The kernels honour what transformers passes a layer's attention: its sliding window (reads start at the
    window; every query masks its own), softcap and sinks; with several splits (a combine) and with one."""
    monkeypatch.setattr(da, "_sm_count", lambda device: 4 if one_split else 132)
    monkeypatch.setattr(da, "ONE_SPLIT", 1e-9 if one_split else 99.0)
    heads, kv_heads, dim, slots = 6, 2, 16, 512
    torch.manual_seed(pos + q)
    query = torch.randn(batch, q, heads, dim, device=device).transpose(1, 2)
    key = torch.randn(batch, kv_heads, slots, dim, device=device)
    value = torch.randn(batch, kv_heads, slots, dim, device=device)
    key[:, :, pos + q:] = float("nan")
    value[:, :, pos + q:] = float("nan")
    if window is not None and pos > window + 2:  # slots left of every query's window: never read either
        key[:, :, : pos - window - 1] = float("nan")
        value[:, :, : pos - window - 1] = float("nan")
    pads = [0, 3, pos + q - 1][:batch]  # the last row: all padding but its own slot
    sink = torch.randn(heads, device=device) * 2 if sinks else None
    windows = [None, window]  # layer 1 has the window under test
    out, _ = da.decode_attention(_Layer(1), query, key, value, None, scaling=0.3, pos=torch.tensor(pos, device=device),
                                 pad=torch.tensor(pads, device=device), fallback=None, windows=windows,
                                 sliding_window=window, softcap=softcap, s_aux=sink)
    want = reference(query, key.nan_to_num(), value.nan_to_num(), pos, pads, 0.3, window, softcap, sink)
    torch.testing.assert_close(out.double(), want, atol=2e-5, rtol=2e-5)


def test_a_layer_passing_another_window_than_its_config_is_refused():
    query = torch.randn(1, 4, 1, 16)
    key = torch.randn(1, 2, 64, 16)
    with pytest.raises(ValueError, match="passes sliding_window=8 but its config"):
        da.decode_attention(_Layer(0), query, key, key, None, pos=torch.tensor(3), pad=torch.zeros(1, dtype=torch.long),
                            fallback=None, windows=[4], sliding_window=8)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("sms", [132, 4])
def test_wide_heads_take_smaller_blocks(device, sms, monkeypatch):
    """Gemma's 256-wide heads: 64-slot blocks in two stages (a stage's tiles fit shared memory), same output."""
    monkeypatch.setattr(da, "_sm_count", lambda device: sms)
    plan = da._plan(2, 2, 4, 512, sms, dim=256)
    assert (plan.block_n, plan.stages) == (da.WIDE_BLOCK_N, 2)
    _check(device, 2, 4, 2, 2, 256, 512, 140, [0, 3])
