"""FlashInfer's paged decode over the fast engine's static caches (hf_rstitch.fast.flashinfer_decode).

Where FlashInfer cannot run (no CUDA, not installed) it says why and refuses to build; on CUDA with FlashInfer
installed it equals our split-K kernel (hf_rstitch.fast.kernels.decode_attention) on the same cache.
"""

import pytest
import torch

from hf_rstitch.fast import flashinfer_decode as fd


def test_why_not_names_the_reason():
    assert "CUDA only" in fd.why_not("cpu", 128, torch.bfloat16)
    assert "float16 / bfloat16" in fd.why_not("cuda", 128, torch.float32)
    assert "head sizes" in fd.why_not("cuda", 96, torch.bfloat16)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="checked after the device")
def test_cuda_cores_refuse_a_group_they_lack():
    keys = torch.zeros(1, 4, 16, 128, dtype=torch.bfloat16, device="cuda")
    with pytest.raises((ValueError, RuntimeError), match="tensor_cores=True|cannot run here"):
        fd.PagedDecode(keys, keys.clone(), heads=28, tensor_cores=False)


def test_refuses_to_build_where_it_cannot_run():
    keys = torch.zeros(1, 2, 16, 128, dtype=torch.bfloat16)
    with pytest.raises(RuntimeError, match="decode_attention"):
        fd.PagedDecode(keys, keys.clone(), heads=4)


RUNS = torch.cuda.is_available() and fd.why_not("cuda", 128, torch.bfloat16) is None


@pytest.mark.gpu
@pytest.mark.skipif(not RUNS, reason="needs CUDA and flashinfer")
@pytest.mark.parametrize("tensor_cores,batch,heads,kv_heads,slots,length", [
    (False, 1, 16, 8, 512, 300), (True, 1, 16, 8, 512, 300),  # Qwen3-0.6B's group of 2
    (True, 3, 28, 4, 1024, 1024),  # Qwen2-7B's group of 7: tensor cores only
])
def test_equals_our_kernel(tensor_cores, batch, heads, kv_heads, slots, length):
    from hf_rstitch.fast.kernels import decode_attention as da

    torch.manual_seed(0)
    keys = torch.randn(batch, kv_heads, slots, 128, dtype=torch.bfloat16, device="cuda")
    values = torch.randn_like(keys)
    query = torch.randn(batch, 1, heads, 128, dtype=torch.bfloat16, device="cuda").transpose(1, 2)
    ours = da._launch(query, keys, values, torch.tensor(length - 1, device="cuda"),
                      torch.zeros(batch, dtype=torch.long, device="cuda"), 128 ** -0.5)
    paged = fd.PagedDecode(keys, values, heads, tensor_cores=tensor_cores)
    paged.plan([length] * batch)
    torch.testing.assert_close(paged.run(query).float(), ours.float(), atol=2e-2, rtol=2e-2)
