"""A served request names the server's own router at its own threshold (``stitch_policy`` ``router`` / ``r2r``):
its tokens and routes equal a request engine built with that router at that threshold, while requests at other
thresholds (and the server's default) share the batch; an engine without a router of that kind refuses the name.
Tiny random models (eager lanes), a random R-Stitch+ router and a random R2R router in R2R's published format."""

import pytest
import torch

import hf_rstitch  # noqa: F401  (patches generate)
from hf_rstitch.batching.requests import Request, RequestEngine
from hf_rstitch.core.policies_rows import ServerRouter, policy_from_spec
from hf_rstitch.router import Router, RouterPolicy
from hf_rstitch.router.r2r import R2RPolicy, load_r2r
from tiny_models import make_pair, prompt


def _requests(specs):
    return [Request(prompt(4 + i, seed=60 + i)[0].tolist(), max_new_tokens=12, request_id=f"r{i}",
                    stitch_policy=policy_from_spec(spec) if spec else None) for i, spec in enumerate(specs)]


def _run(llm, slm, policy, specs):
    engine = RequestEngine.of(llm, slm, max_batch=4, policy=policy, engine="default")
    return {k: (c.tokens, c.trace.roles) for k, c in engine.run(_requests(specs)).items()}


def _router_policy(slm, kind, tmp_path):
    if kind == "router":
        torch.manual_seed(3)
        return RouterPolicy(Router(slm.config.hidden_size, width=8, num_blocks=1), 0.3)
    from router.test_r2r import save_their_router, their_state  # R2R's published format, random weights

    save_their_router(tmp_path, their_state(slm.config.hidden_size, slm.config.hidden_size, False),
                      slm.config.hidden_size, 0.5)
    return R2RPolicy(load_r2r(str(tmp_path), slm, None))


@pytest.mark.parametrize("kind,taus", [("router", [0.0, 0.6]), ("r2r", [0.1, 0.9])])
def test_a_request_at_its_own_threshold_equals_an_engine_built_at_it(kind, taus, tmp_path):
    llm, slm = make_pair("llama")
    base = _router_policy(slm, kind, tmp_path)
    specs = [{"name": kind, "threshold": taus[0]}, None, {"name": kind, "threshold": taus[1]}, None]
    mixed = _run(llm, slm, base, specs)
    alone = {t: _run(llm, slm, base.with_threshold(t), [None] * 4) for t in taus}
    default = _run(llm, slm, base, [None] * 4)
    assert mixed["r0"] == alone[taus[0]]["r0"] and mixed["r2"] == alone[taus[1]]["r2"]
    assert mixed["r1"] == default["r1"] and mixed["r3"] == default["r3"]
    assert len({tuple(v[1]) for v in (alone[taus[0]]["r0"], alone[taus[1]]["r0"])}) == 2  # the thresholds matter


def test_an_engine_without_that_router_refuses_the_name(tmp_path):
    llm, slm = make_pair("llama")
    plain = RequestEngine.of(llm, slm, max_batch=2, engine="default")
    with pytest.raises(ValueError, match="start the server with --router"):
        plain.submit(_requests([{"name": "router", "threshold": 0.1}])[0])
    routed = RequestEngine.of(llm, slm, max_batch=2, policy=_router_policy(slm, "router", tmp_path), engine="default")
    with pytest.raises(ValueError, match="'r2r' routes by the server's own r2r router"):
        routed.submit(_requests([{"name": "r2r", "threshold": 0.1}])[0])
    with pytest.raises(ValueError, match="stitch_threshold"):  # its own rule: no threshold beside it
        routed.submit(Request([5, 6], max_new_tokens=2, stitch_threshold=0.1,
                              stitch_policy=ServerRouter("router", 0.1)))
