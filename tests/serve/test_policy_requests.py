"""Per-request routing rules behind ``rstitch serve``: a request's ``stitch_policy`` (name and parameters)
answers what solo ``generate`` with that policy answers, while other requests share the batch."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from hf_rstitch.toyworld.pair import assets_present
from serve.live import LiveServer
from serve.pair_cases import SERVER_TAU, body, got, pair, problem

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not assets_present(), reason="shipped toy-world pair absent")]

SPECS = [(0, {"name": "step", "threshold": 0.005, "delimiter": "."}, 48), (1, {"name": "rstitch", "threshold": 0.05}, 40),
         (2, None, 40), (3, {"name": "rstitch", "threshold": 0.001}, 32), (4, {"name": "step", "threshold": 0.0, "delimiter": "."}, 40)]


def solo_with(i, spec, max_tokens):
    import torch

    from hf_rstitch.core.policies_rows import policy_from_spec
    from hf_rstitch.eval.data import prompt_ids

    llm, slm, tok = pair()
    ids = torch.tensor([prompt_ids(tok, problem(i), instruction="")])
    routing = {"stitch_policy": policy_from_spec(spec, tok)} if spec else {"stitch_threshold": SERVER_TAU}
    out = llm.generate(ids, attention_mask=torch.ones_like(ids), assistant_model=slm, do_sample=False,
                       max_new_tokens=max_tokens, return_dict_in_generate=True, **routing)
    t = out.stitch
    return {"text": tok.decode(out.sequences[0, ids.shape[1]:].tolist(), skip_special_tokens=True),
            "completion_tokens": t.n_tokens, "llm_tokens": t.llm_tokens, "slm_tokens": t.slm_tokens,
            "switches": t.switches}


def test_each_request_routes_by_its_own_policy(one_thread):
    from hf_rstitch.serve.app import create_app
    from hf_rstitch.serve.config import ServeConfig, settings_for
    from hf_rstitch.batching.requests import RequestEngine

    llm, slm, tok = pair()
    engine = RequestEngine.of(llm, slm, threshold=SERVER_TAU, max_batch=3)
    app = create_app(engine, tok, settings_for(ServeConfig(threshold=SERVER_TAU, max_batch=3), llm))
    with LiveServer(app) as srv, ThreadPoolExecutor(len(SPECS)) as pool:
        def ask(case):
            i, spec, n = case
            extra = {"stitch_policy": spec} if spec else {}
            r = httpx.post(srv.url + "/v1/chat/completions", json=body(i, None, n, **extra), timeout=120)
            assert r.status_code == 200, r.text
            return got(r.json())

        answers = list(pool.map(ask, SPECS))
        bad = httpx.post(srv.url + "/v1/chat/completions", timeout=30,
                         json=body(0, 0.02, 8, stitch_policy={"name": "step", "threshold": 0.1}))
        unknown = httpx.post(srv.url + "/v1/chat/completions", timeout=30,
                             json=body(0, None, 8, stitch_policy={"name": "step"}))
    for case, answer in zip(SPECS, answers):
        assert answer == solo_with(*case), case
    assert bad.status_code == 400 and "stitch_threshold" in bad.text
    assert unknown.status_code == 400 and "threshold" in unknown.text
