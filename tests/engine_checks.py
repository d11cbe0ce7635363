"""Comparing one engine's stitched generate with another's: the fast engine against the eager one."""

from __future__ import annotations

import torch


def generate_n(llm, slm, ids, mask, engine, n_new: int, **kw):
    """Exactly ``n_new`` stitched tokens on ``engine``, with the trace(s) and the logits of every step."""
    return llm.generate(ids, attention_mask=mask, assistant_model=slm, stitch_engine=engine, max_new_tokens=n_new,
                        min_new_tokens=n_new, return_dict_in_generate=True, output_logits=True, **kw)


def assert_same(out, ref, tol: float) -> None:
    """Same tokens and routes in every row, logits within ``tol``."""
    assert torch.equal(out.sequences, ref.sequences)
    traces = lambda o: o.stitch if isinstance(o.stitch, list) else [o.stitch]  # noqa: E731
    assert [t.roles for t in traces(out)] == [t.roles for t in traces(ref)]
    for a, b in zip(out.logits, ref.logits):
        torch.testing.assert_close(a, b, rtol=tol, atol=tol)


def assert_same_run(out, ref) -> None:
    """Same tokens, routes and per-row forward-call records in every row; entropies and logits (where returned)
    within 1e-9 (fp64 tiny models)."""
    import pytest

    traces = lambda o: o.stitch if isinstance(o.stitch, list) else [o.stitch]  # noqa: E731
    calls = lambda t: [(c.role, c.kind, c.n_inf, c.n_kv) for c in t.calls]  # noqa: E731
    assert torch.equal(out.sequences, ref.sequences)
    assert [t.roles for t in traces(out)] == [t.roles for t in traces(ref)]
    assert [calls(t) for t in traces(out)] == [calls(t) for t in traces(ref)]
    for a, b in zip(traces(out), traces(ref)):
        assert a.entropies == pytest.approx(b.entropies, abs=1e-9)
    for a, b in zip(out.logits or (), ref.logits or ()):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-9)
