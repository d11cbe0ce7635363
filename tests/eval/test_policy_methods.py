"""The harness's step-level and R2R methods: built from EvalConfig values, named by their parameter, and each
one's generate equals generate with its policy object."""

import pytest
import torch

from hf_rstitch.eval.config import EvalConfig
from hf_rstitch.eval.methods import GenSettings, build_methods


def test_config_checks_the_new_methods():
    with pytest.raises(ValueError, match="step-thresholds"):
        EvalConfig(llm="shipped:llm", slm="shipped:slm", data=["x.jsonl"], methods=["step"], step_thresholds=[])
    with pytest.raises(ValueError, match="r2r-router"):
        EvalConfig(llm="shipped:llm", slm="shipped:slm", data=["x.jsonl"], methods=["r2r"])
    with pytest.raises(ValueError, match="step-thresholds"):
        EvalConfig(llm="shipped:llm", slm="shipped:slm", data=["x.jsonl"], methods=["step"], step_thresholds=[1.5])


def test_step_and_r2r_methods(tmp_path):
    from hf_rstitch.core.policies_step import StepPolicy
    from hf_rstitch.router.r2r import R2RRouter, save_r2r
    from hf_rstitch.toyworld.pair import load_pair

    llm, slm, tok = load_pair("cpu")
    torch.manual_seed(0)
    embed = slm.get_input_embeddings().weight.detach()
    path = save_r2r(R2RRouter(slm.config.hidden_size, embed, 100, [16, 16], threshold=0.6), tmp_path / "r.pt")
    settings = GenSettings(max_new_tokens=12)
    methods = build_methods(["step", "r2r"], llm, slm, settings, step_thresholds=[0.02], step_delimiter=".",
                            tokenizer=tok, r2r_router=str(path), r2r_thresholds=[0.5])
    assert [m.name for m in methods] == ["step@0.02", "r2r@0.5"]
    ids = torch.tensor([tok("<|user|>Tom has 5 apples.<|end|><|assistant|>")["input_ids"]])
    new, counts = methods[0].run(ids)
    want = llm.generate(ids, assistant_model=slm, stitch_policy=StepPolicy(0.02, ".", tok), max_new_tokens=12,
                        do_sample=False, return_dict_in_generate=True)
    assert new == want.sequences[0, ids.shape[1]:].tolist()[: len(new)] and counts["new_tokens"] == len(new)
    new, counts = methods[1].run(ids)
    want = llm.generate(ids, assistant_model=slm, stitch_router=str(path), stitch_threshold=0.5, max_new_tokens=12,
                        do_sample=False, return_dict_in_generate=True)
    assert new == want.sequences[0, ids.shape[1]:].tolist()[: len(new)]


def test_speculate_method_writes_the_rstitch_tokens():
    from hf_rstitch.toyworld.pair import load_pair

    llm, slm, tok = load_pair("cpu")
    settings = GenSettings(max_new_tokens=16)
    spec, plain = build_methods(["speculate", "rstitch"], llm, slm, settings, thresholds=[0.001], speculate_k=3)
    assert spec.name == "speculate@0.001" and spec.one_row and spec.engine_spec() is None
    ids = torch.tensor([tok("<|user|>Tom has 5 apples.<|end|><|assistant|>")["input_ids"]])
    (new, counts), (want, want_counts) = spec.run(ids), plain.run(ids)
    assert new == want and counts["llm_tokens"] == want_counts["llm_tokens"]
    assert counts["llm_forward_calls"] <= want_counts["llm_forward_calls"] and counts["drafted_tokens"] > 0


def test_config_checks_speculate():
    with pytest.raises(ValueError, match="speculate-k"):
        EvalConfig(llm="shipped:llm", slm="shipped:slm", data=["x.jsonl"], methods=["speculate"], speculate_k=0)
    with pytest.raises(ValueError, match="greedily"):
        EvalConfig(llm="shipped:llm", slm="shipped:slm", data=["x.jsonl"], methods=["speculate"], do_sample=True)
