"""A lane's cache after stitched decoding equals a recompute from scratch over what it saw."""

import pytest
import torch
from transformers import DynamicCache

from hf_rstitch import Role
from hf_rstitch.core.policies import ReplayPolicy
from hf_rstitch.decode import EagerEngine
from hf_rstitch.hf.compat import with_cache
from tiny_models import ARCHS, make_pair, prompt

ROUTE = ["slm"] * 3 + ["llm"] * 2 + ["slm"] * 4 + ["llm"] + ["slm"] * 3 + ["llm"] * 3 + ["slm"]


@pytest.mark.parametrize("arch", ARCHS)
def test_caches_equal_a_full_recompute(arch):
    llm, slm = make_pair(arch)
    ids = prompt(12)
    engine = EagerEngine()
    out = llm.generate(ids, assistant_model=slm, stitch_policy=ReplayPolicy(ROUTE), max_new_tokens=len(ROUTE),
                       return_dict_in_generate=True, stitch_engine=engine)
    lanes = engine.built
    assert out.stitch.roles == [Role(r) for r in ROUTE]
    for role, model in ((Role.SLM, slm), (Role.LLM, llm)):
        lane = lanes[role]
        fresh = DynamicCache(config=model.config)
        with torch.no_grad():
            model(input_ids=out.sequences[:, : lane.seen], **with_cache(model, fresh), use_cache=True)
        assert lane.cache.get_seq_length() == fresh.get_seq_length() == lane.seen
        for got, want in zip(lane.cache.layers, fresh.layers):
            torch.testing.assert_close(got.keys, want.keys)
            torch.testing.assert_close(got.values, want.values)


@pytest.mark.parametrize("arch", ARCHS)
def test_padding_free_fast_path_equals_the_masked_path(arch, monkeypatch):
    """Without padding a lane passes no attention mask and column indices as positions; forcing the
    general path (mask + cumsum positions) must give bit-identical logits, tokens and trace."""
    from hf_rstitch.decode.lane import Lane

    llm, slm = make_pair(arch)
    ids = prompt(12)
    kw = dict(stitch_policy=ReplayPolicy(ROUTE), max_new_tokens=len(ROUTE), return_dict_in_generate=True,
              output_logits=True)
    runs = {}
    for dense in (True, False):
        with monkeypatch.context() as m:
            if not dense:
                m.setattr(Lane, "_padding_free", staticmethod(lambda mask: False))
            engine = EagerEngine()
            runs[dense] = llm.generate(ids, attention_mask=torch.ones_like(ids), assistant_model=slm,
                                       stitch_engine=engine, **kw)
            assert all(lane.dense is dense for lane in engine.built.values())
    fast, general = runs[True], runs[False]
    assert torch.equal(fast.sequences, general.sequences)
    assert all(torch.equal(a, b) for a, b in zip(fast.logits, general.logits))
    assert fast.stitch.entropies == general.stitch.entropies
    assert fast.stitch.calls == general.stitch.calls
