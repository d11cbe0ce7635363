"""A lane's warm-up records the graphs of buckets whose kernels an earlier bucket ran without running them first
(``GraphRunner.record``): which buckets run for real, and that graphs recorded so give the same generations.

On CPU, with a stand-in for the CUDA graph runner whose "graph" is the recorded call itself, replayed under the
lane's model code (a CUDA graph replays the same kernels over the same buffers).
"""

import pytest
import torch

from hf_rstitch import ReplayPolicy, Role
from hf_rstitch.fast import FastConfig, FastEngine
from hf_rstitch.fast.buckets import bucket_sizes, kernel_class
from tiny_models import make_pair, prompt

ROUTE = ["slm"] * 3 + ["llm"] * 2 + ["slm"] * 17 + ["llm"] + ["slm"] * 7 + ["llm"] * 6 + ["slm"] * 2 + ["llm"]


class Recorder:
    """GraphRunner's interface on CPU: ``run`` calls for real at a key's first use, ``record`` keeps the call
    without running it; a later ``run`` of the key calls what was kept (under the lane's model code)."""

    def __init__(self, lane):
        self.lane, self.graphs, self.log = lane, {}, []

    def __contains__(self, key):
        return key in self.graphs

    def run(self, key, fn):
        if key in self.graphs:
            with self.lane._model_code():
                return self.graphs[key]()
        self.log.append(("run", key))
        self.graphs[key] = fn
        return fn()

    def record(self, key, fn):
        self.log.append(("record", key))
        self.graphs[key] = fn


def _generate(llm, slm, engine):
    return llm.generate(prompt(12), assistant_model=slm, stitch_policy=ReplayPolicy(ROUTE), stitch_engine=engine,
                        max_new_tokens=len(ROUTE), min_new_tokens=len(ROUTE), return_dict_in_generate=True,
                        output_logits=True)


def test_kernel_classes_follow_tritons_integer_specializations():
    assert [kernel_class(s) for s in bucket_sizes(128)] == [1, 2, 2, 2, 16, 16, 16, 16]


@pytest.mark.parametrize("arch", ["llama", "qwen2-full"])
def test_buckets_recorded_without_a_run_give_the_same_generation(arch):
    llm, slm = make_pair(arch)
    ref = _generate(llm, slm, "default")
    engine = FastEngine(FastConfig(max_bucket=32, graphs=False))
    _generate(llm, slm, engine)  # builds the lanes (no graphs on CPU)
    for lane in engine._lanes.values():
        lane.graphs = Recorder(lane)
        lane.warm_up()
        # one bucket of each kernel class run for real, the others only recorded
        assert lane.graphs.log == [("run", (1, 1, False)), ("run", (1, 2, False)), ("record", (1, 4, False)),
                                   ("record", (1, 8, False)), ("run", (1, 16, False)), ("record", (1, 32, False))]
        assert lane.seen == 0 and int(lane.cache.pos) == 0
    out = _generate(llm, slm, engine)
    assert engine.builds == 2
    assert all(len(lane.graphs.log) == 6 for lane in engine._lanes.values())  # every call a replay
    assert torch.equal(out.sequences, ref.sequences)
    assert out.stitch.roles == ref.stitch.roles == [Role(r) for r in ROUTE]
    for a, b in zip(out.logits, ref.logits):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-9)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_fp32_graphs_recorded_without_a_run_equal_those_run_first(monkeypatch):
    """On CUDA: lanes warmed up with graphs recorded straight away give the tokens and logits (bit for bit) of lanes
    whose every graph was run first, and every such recording took (none failed back to a real call)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from hf_rstitch.fast import graphs

    def make(hidden, layers, seed):
        torch.manual_seed(seed)
        cfg = Qwen2Config(vocab_size=1024, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                          num_attention_heads=8, num_key_value_heads=2, initializer_range=0.1)
        model = Qwen2ForCausalLM(cfg).to("cuda", torch.float32).eval()
        model.generation_config.eos_token_id, model.generation_config.pad_token_id = None, 0
        return model

    llm, slm = make(256, 4, 0), make(128, 2, 1)
    ids = torch.randint(0, 1024, (1, 37), device="cuda")
    outs, lean = [], []
    for on in (True, False):  # lean first: its recordings meet kernels this process has not launched yet
        monkeypatch.setattr(graphs, "LEAN", on)
        engine = FastEngine(FastConfig(max_bucket=32, attention="split", gemv=False, warm_up=True))
        outs.append(llm.generate(ids, assistant_model=slm, stitch_policy=ReplayPolicy(ROUTE), stitch_engine=engine,
                                 max_new_tokens=len(ROUTE), do_sample=False, return_dict_in_generate=True,
                                 output_logits=True))
        lean.append([(lane.graphs.lean, lane.graphs.lean_failed) for lane in engine._lanes.values()])
    assert lean[0] == [(3, 0), (3, 0)] and lean[1] == [(0, 0), (0, 0)]  # buckets 4, 8 and 32 of each lane
    assert torch.equal(outs[0].sequences, outs[1].sequences)
    for a, b in zip(outs[0].logits, outs[1].logits):
        assert torch.equal(a, b)
