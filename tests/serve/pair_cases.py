"""The shipped pair behind the server: requests with their solo ``generate`` references."""

from __future__ import annotations

import functools

# (problem index, stitch_threshold or None for the server default, max_tokens)
CASES = [(0, None, 48), (1, 0.001, 40), (2, 0.05, 56), (3, 0.02, 8), (4, 1.0, 32), (5, 0.0, 24)]
SERVER_TAU = 0.02


@functools.lru_cache(maxsize=1)
def pair():
    from hf_rstitch.toyworld.pair import load_pair

    return load_pair("cpu")


LONGEST = (23, 32, 17, 14, 8, 2)  # problems whose greedy answers are the shipped LLM's longest: 290, 288, 288, 282,
# 282 and 274 tokens (the tests that must still be running when something happens ask these)


def problem(i: int) -> str:
    from hf_rstitch.toyworld.pair import load_test_split

    return load_test_split()[i]["problem"]


@functools.lru_cache(maxsize=None)
def solo(i: int, tau: float | None, max_tokens: int, router: str | None = None) -> dict:
    """Greedy solo generate (with the threshold, or ``router``): the completion text and its stitch counts (cached:
    treat as read-only)."""
    import torch

    import hf_rstitch  # noqa: F401
    from hf_rstitch.eval.data import prompt_ids

    llm, slm, tok = pair()
    ids = torch.tensor([prompt_ids(tok, problem(i), instruction="")])
    routing = (dict(stitch_router=router, **({} if tau is None else {"stitch_threshold": tau})) if router
               else dict(stitch_threshold=SERVER_TAU if tau is None else tau))
    out = llm.generate(ids, attention_mask=torch.ones_like(ids), assistant_model=slm, do_sample=False,
                       max_new_tokens=max_tokens, return_dict_in_generate=True, **routing)
    new = out.sequences[0, ids.shape[1]:].tolist()
    trace = out.stitch
    return {"text": tok.decode(new, skip_special_tokens=True), "completion_tokens": trace.n_tokens,
            "llm_tokens": trace.llm_tokens, "slm_tokens": trace.slm_tokens, "switches": trace.switches}


def body(i: int, tau: float | None, max_tokens: int, **extra) -> dict:
    b = {"messages": [{"role": "user", "content": problem(i)}], "max_tokens": max_tokens, **extra}
    if tau is not None:
        b["stitch_threshold"] = tau
    return b


def got(response_body: dict) -> dict:
    u = response_body["usage"]
    return {"text": response_body["choices"][0]["message"]["content"],
            **{k: u[k] for k in ("completion_tokens", "llm_tokens", "slm_tokens", "switches")}}
