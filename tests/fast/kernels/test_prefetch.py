"""The one-row kernels' L2 prefetch (gemv.PREFETCH_L2) and the tuner's cold timing (triton_support.COLD_TUNING).

The prefetch is PTX: off CUDA it is never launched (the interpreter runs no inline assembly), so on CPU the kernels
are compiled for sm90 instead and their PTX read: the prefetch must come before the programmatic-dependent-launch
wait. On CUDA the products must equal, bit for bit, the same launches without it (a prefetch moves bytes to L2 and
changes no arithmetic).
"""

import pytest
import torch

from hf_rstitch.fast.kernels import gated, gemv, triton_support

CUDA = torch.cuda.is_available() and gemv.available("cuda")


@pytest.mark.parametrize("n,k,size,count,budget,lines", [
    (4096, 1024, 2, 1, None, 16),  # Qwen3-0.6B q/k/v: 16 lines of 128 bytes a row, all of it
    (1024, 3072, 2, 1, None, 64),  # its down projection: 48 lines, rounded up to 64 (the kernel masks the rest)
    (3072, 1024, 2, 2, None, 16),  # its gate and up (two weights)
    (3584, 18944, 2, 1, None, 32),  # Qwen2-7B down: 296 lines a row, 16 MiB allow 36 a row -> 32
    (151936, 1024, 2, 1, None, 0),  # an LM head: not one line a row within the budget
    (64, 96, 4, 1, 64 * 128, 1),  # float32, a budget of one line a row: 3 lines a row do not fit
])
def test_lines_to_prefetch(n, k, size, count, budget, lines):
    assert gemv.lines_to_prefetch(n, k, size, count, budget) == lines
    whole = gemv.lines_to_prefetch(n, k, size, count, budget, whole=True)  # "whole": only weights that fit whole
    assert whole == (lines if -(-k * size // gemv.LINE) <= lines else 0)


def test_no_prefetch_off_cuda_or_switched_off(monkeypatch):
    w = torch.zeros(8, 64)
    for mode in ("all", "whole", "off"):
        monkeypatch.setattr(gemv, "PREFETCH_L2", mode)
        assert gemv.prefetch_lines(w) == 0  # CPU (and the interpreter): no PTX
    monkeypatch.setattr(gemv, "PREFETCH_L2", True)
    with pytest.raises(ValueError, match="must be one of"):
        gemv.prefetch_lines(w)


def _ptx(kernel, pointers: dict, scalars: dict, constexprs: dict) -> str:
    triton = pytest.importorskip("triton")
    try:
        from triton.backends.compiler import GPUTarget
        from triton.compiler import ASTSource
    except ImportError:
        pytest.skip("this Triton has no ASTSource / GPUTarget to compile without a device")
    signature = {**{k: "*bf16" for k in pointers}, **scalars, **{k: "constexpr" for k in constexprs}}
    try:
        compiled = triton.compile(ASTSource(fn=kernel, signature=signature, constexprs=constexprs),
                                  target=GPUTarget("cuda", 90, 32))
    except Exception as err:  # noqa: BLE001 - no CUDA backend or ptxas here
        pytest.skip(f"cannot compile for sm90 here: {type(err).__name__}: {err}")
    return compiled.asm["ptx"]


def _prefetch_before_wait(ptx: str, expected: int) -> None:
    body = ptx[ptx.find(".entry"):]
    assert body.count("prefetch.global.L2") == expected
    assert 0 <= body.find("prefetch.global.L2") < body.find("griddepcontrol.wait")


@pytest.mark.skipif(triton_support.interpreted(), reason="compiles real kernels (not under TRITON_INTERPRET=1)")
def test_gemv_prefetches_before_the_wait():
    ptx = _ptx(gemv._kernel(), dict.fromkeys(("x_ptr", "w_ptr", "b_ptr", "y_ptr", "nw_ptr", "r_ptr")),
               {"eps": "fp32", "N": "i32", "K": "i32", "stride_n": "i32"},
               dict(HAS_BIAS=False, EVEN_N=True, EVEN_K=True, BLOCK_N=4, BLOCK_K=512, PDL=True, NORM=True, ADD=True,
                    PREFETCH=32, STEP=64))
    _prefetch_before_wait(ptx, 1)  # [4, 32] lines over 128 threads: one prefetch a thread


@pytest.mark.skipif(triton_support.interpreted(), reason="compiles real kernels (not under TRITON_INTERPRET=1)")
def test_gated_prefetches_both_weights_before_the_wait():
    ptx = _ptx(gated._kernel(), dict.fromkeys(("x_ptr", "g_ptr", "u_ptr", "y_ptr", "nw_ptr")),
               {"eps": "fp32", "N": "i32", "K": "i32", "stride_g": "i32", "stride_u": "i32"},
               dict(EVEN_N=True, EVEN_K=True, BLOCK_N=8, BLOCK_K=512, PDL=True, NORM=True, PREFETCH=16, STEP=64))
    _prefetch_before_wait(ptx, 2)


@pytest.mark.skipif(not CUDA, reason="the prefetch runs on CUDA only")
@pytest.mark.parametrize("n,k,cfg", [(4096, 1024, gemv.GemvConfig(4, 512)), (1024, 3072, gemv.GemvConfig(2, 1024)),
                                     (100, 200, gemv.GemvConfig(8, 256))])
def test_prefetch_changes_no_product(monkeypatch, n, k, cfg):
    torch.manual_seed(n)
    dev = "cuda"
    w, g, u = (torch.randn(n, k, device=dev, dtype=torch.bfloat16) for _ in range(3))
    x, r = torch.randn(1, k, device=dev, dtype=torch.bfloat16), torch.randn(1, n, device=dev, dtype=torch.bfloat16)
    nw = torch.rand(k, device=dev, dtype=torch.bfloat16) + 0.5

    def run():
        return (gemv.launch(x, w, None, cfg, nw, 1e-6, r), gemv.launch(x, w, None, cfg),
                gated.launch(x, g, u, cfg, nw, 1e-6))

    plain = run()
    monkeypatch.setattr(gemv, "PREFETCH_L2", "all")
    assert gemv.prefetch_lines(w) > 0
    for a, b in zip(plain, run()):
        assert torch.equal(a, b)


def test_cold_copies_take_turns(monkeypatch):
    w, b = torch.randn(5, 5), torch.randn(5)  # 120 bytes
    monkeypatch.setattr(triton_support, "l2_bytes", lambda device: 300)
    monkeypatch.setattr(triton_support, "COLD_TUNING", False)
    turn = triton_support.cold_copies((w, b), calls=8)
    assert all(turn()[0] is w for _ in range(5))
    monkeypatch.setattr(triton_support, "COLD_TUNING", True)
    turn = triton_support.cold_copies((w, b), calls=8)  # 2 x 300 bytes of L2 / 120 bytes: 5 sets
    seen = [turn() for _ in range(10)]
    assert seen[0][0] is w and seen[5][0] is w and len({id(s[0]) for s in seen}) == 5
    assert all(torch.equal(s[0], w) and torch.equal(s[1], b) for s in seen)
    few = triton_support.cold_copies((w, b), calls=3)  # never more sets than launches
    assert len({id(few()[0]) for _ in range(6)}) == 3
