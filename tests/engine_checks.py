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
