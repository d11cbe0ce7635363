"""R2R routers in their published format (thu-nics/R2R's ``save_model`` .pt, in a folder with its
``model_configs.json``), saved here from random weights: our forward equals a straight re-implementation
of theirs written below on the same inputs, and ``generate(stitch_router=FOLDER)`` makes the decisions a
cache-free reference of R2R's loop makes (every SLM token judged, one LLM token, then the SLM), on the
eager engine and the fast engine's CPU static path."""

import json

import pytest
import torch
import torch.nn.functional as F

from hf_rstitch.core.roles import Role
from hf_rstitch.fast import FastConfig, FastEngine
from hf_rstitch.hf.decode import resolve_policy
from hf_rstitch.router.r2r import R2R_TYPE, R2RPolicy, load_r2r
from tiny_models import ARCHS, make_pair, prompt

K, DIMS, EXPANSION = 10, [16, 24, 16], 2
N_NEW = 16


def their_state(hidden: int, embed: int, normalize: bool, seed: int = 0) -> dict:
    """Random weights under R2R's HiddenStatesTokenLMHeadLogitsClassifier names (token embeddings left
    out, as their published files do)."""
    g = torch.Generator().manual_seed(seed)
    w = lambda *shape: torch.randn(*shape, generator=g) / shape[-1] ** 0.5  # noqa: E731
    b = lambda n: 0.1 * torch.randn(n, generator=g)  # noqa: E731
    s = {"logits_projection.weight": w(hidden, K), "logits_projection.bias": b(hidden),
         "combined_projection.weight": w(DIMS[0], 2 * hidden + embed), "combined_projection.bias": b(DIMS[0]),
         "backbone.input_projection.weight": w(DIMS[0], DIMS[0]), "backbone.input_projection.bias": b(DIMS[0])}
    dims = DIMS + [DIMS[-1]]
    for i, (a, o) in enumerate(zip(dims[:-1], dims[1:])):
        p = f"backbone.blocks.{i}."
        s.update({p + "layer_norm.weight": 1 + b(a), p + "layer_norm.bias": b(a),
                  p + "mlp.0.weight": w(a * EXPANSION, a), p + "mlp.0.bias": b(a * EXPANSION),
                  p + "mlp.3.weight": w(o, a * EXPANSION), p + "mlp.3.bias": b(o)})
        if a != o:
            s.update({p + "dim_change.weight": w(o, a), p + "dim_change.bias": b(o)})
    s.update({"backbone.output_layer.0.weight": 1 + b(DIMS[-1]), "backbone.output_layer.0.bias": b(DIMS[-1]),
              "backbone.output_layer.1.weight": 3 * w(1, DIMS[-1]), "backbone.output_layer.1.bias": b(1)})
    if normalize:
        s.update({"layer_norm_hidden_states.weight": 1 + b(hidden), "layer_norm_hidden_states.bias": b(hidden),
                  "layer_norm_token.weight": 1 + b(embed), "layer_norm_token.bias": b(embed)})
    return s


def their_forward(s: dict, embed: torch.Tensor, hidden, token, logits, normalize: bool) -> torch.Tensor:
    """R2R's forward, transcribed from their classifier: returns sigmoid(logit) [B]."""
    lin = lambda x, name: F.linear(x, s[name + ".weight"], s[name + ".bias"])  # noqa: E731
    ln = lambda x, name: F.layer_norm(x, x.shape[-1:], s[name + ".weight"], s[name + ".bias"])  # noqa: E731
    top = torch.topk(logits.float(), K, dim=-1).values
    tok = embed[token].float()
    h = hidden.float()
    if normalize:
        h, tok, top = ln(h, "layer_norm_hidden_states"), ln(tok, "layer_norm_token"), torch.softmax(top, -1)
    x = lin(torch.cat([h, tok, lin(top, "logits_projection")], -1), "combined_projection")
    x = lin(x, "backbone.input_projection")
    for i in range(len(DIMS)):
        p = f"backbone.blocks.{i}."
        res = lin(x, p + "dim_change") if p + "dim_change.weight" in s else x
        x = res + lin(F.gelu(lin(ln(x, p + "layer_norm"), p + "mlp.0")), p + "mlp.3")
    return torch.sigmoid(lin(ln(x, "backbone.output_layer.0"), "backbone.output_layer.1")).squeeze(-1)


def save_their_router(folder, state, hidden, threshold, normalize=False, folder_threshold=None):
    """A folder as R2R's router collection publishes one: the router .pt and model_configs.json."""
    folder.mkdir(parents=True, exist_ok=True)
    ckpt = {"model_type": R2R_TYPE,
            "init_args": {"hidden_states_size": hidden, "logits_size": K, "hidden_dims": DIMS,
                          "expansion_factor": EXPANSION, "dropout_rate": 0.1, "use_position_embedding": False,
                          "freeze_lm_head": True, "normalize_input": normalize, "pretrained_model_name": "tiny/slm"},
            "common_args": {"threshold": threshold, "input_type": ["hidden_states", "token", "logits"]},
            "model_specific_args": {}, "state_dict": state}
    torch.save(ckpt, folder / "router.pt")
    router_cfg = {"router_name": "tiny", "router_path": "resource/tiny/router.pt"}
    if folder_threshold is not None:
        router_cfg["threshold"] = folder_threshold
    (folder / "model_configs.json").write_text(json.dumps({"router": router_cfg}))
    return folder


@pytest.mark.parametrize("normalize", [False, True])
def test_our_forward_equals_theirs(tmp_path, normalize):
    _, slm = make_pair("llama")
    embed = slm.get_input_embeddings().weight.detach()
    state = their_state(32, embed.shape[1], normalize)
    folder = save_their_router(tmp_path / "r", state, 32, 0.5, normalize)
    router = load_r2r(folder, slm)
    g = torch.Generator().manual_seed(1)
    hidden, logits = torch.randn(64, 32, generator=g), 4 * torch.randn(64, 96, generator=g)
    want = their_forward(state, embed, hidden, logits.argmax(-1), logits, normalize)
    got = router(*router.features(hidden, logits))
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    tau = float(want.median())
    assert torch.equal(router.diverges(hidden, logits, tau), want >= tau)
    assert 0 < int((want >= tau).sum()) < 64  # both decisions occur


def test_thresholds_and_formats(tmp_path):
    llm, slm = make_pair("llama")
    state = their_state(32, 32, False)
    folder = save_their_router(tmp_path / "r", state, 32, 0.4, folder_threshold=0.3)
    assert load_r2r(folder, slm).threshold == 0.3  # model_configs.json's router.threshold wins
    assert load_r2r(folder / "router.pt", slm).threshold == 0.4  # the .pt's common_args
    policy = resolve_policy(0.7, None, llm.generation_config, str(folder), slm)  # stitch_threshold overrides
    assert isinstance(policy, R2RPolicy) and policy.threshold == 0.7
    (tmp_path / "ours").mkdir()
    assert load_r2r(tmp_path / "ours", slm) is None  # no R2R file: another format, the caller's other loader
    bad = dict(torch.load(folder / "router.pt", weights_only=True), model_type="LogitsClassifier")
    torch.save(bad, tmp_path / "bad.pt")
    with pytest.raises(ValueError, match="HiddenStatesTokenLMHeadLogitsClassifier"):
        load_r2r(tmp_path / "bad.pt", slm)
    _, other = make_pair("llama", slm_vocab=80)
    with pytest.raises(ValueError, match="hidden size|another SLM|embeddings"):
        save_their_router(tmp_path / "h", their_state(48, 32, False), 48, 0.5)
        load_r2r(tmp_path / "h", other)


@torch.no_grad()
def reference_r2r(llm, slm, ids, state, embed, tau, n_new, eos=1):
    """R2R's loop without caches: judge each SLM token; the LLM writes the judged-divergent ones."""
    seq, roles = ids, []
    for _ in range(n_new):
        out = slm(input_ids=seq, output_hidden_states=True)
        logits = out.logits[:, -1]
        token = logits.argmax(-1)
        writer = Role.SLM
        if their_forward(state, embed, out.hidden_states[-1][:, -1], token, logits, False).item() >= tau:
            writer, token = Role.LLM, llm(input_ids=seq).logits[:, -1].argmax(-1)
        seq, roles = torch.cat([seq, token[:, None]], -1), roles + [writer]
        if token.item() == eos:
            break
    return seq, roles


@pytest.mark.slow
@pytest.mark.parametrize("arch", ARCHS)
def test_generate_with_r2r_folder_equals_reference(tmp_path, arch):
    llm, slm = make_pair(arch)
    embed = slm.get_input_embeddings().weight.detach()
    state = their_state(32, embed.shape[1], False, seed=2)
    ids, mixed = prompt(7, seed=5), 0
    with torch.no_grad():  # thresholds among the router's probabilities along the SLM's own continuation
        alone = slm.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=N_NEW, do_sample=False)
        out = slm(input_ids=alone, output_hidden_states=True)
        h, z = out.hidden_states[-1][0, ids.shape[1] - 1:], out.logits[0, ids.shape[1] - 1:]
        probs = their_forward(state, embed, h, z.argmax(-1), z, False)
    for tau in probs.quantile(torch.tensor([0.25, 0.5, 0.75], dtype=probs.dtype)).tolist():
        folder = save_their_router(tmp_path / f"r{tau}", state, 32, tau)
        want, roles = reference_r2r(llm, slm, ids, state, embed, tau, N_NEW)
        for engine in ("default", FastEngine(FastConfig(max_bucket=4, graphs=False))):
            out = llm.generate(ids, attention_mask=torch.ones_like(ids), assistant_model=slm, stitch_router=str(folder),
                               stitch_engine=engine, max_new_tokens=N_NEW, do_sample=False, return_dict_in_generate=True)
            trace = out.stitch[0] if isinstance(out.stitch, list) else out.stitch
            assert torch.equal(out.sequences, want)
            assert trace.roles == roles
        mixed += len(set(roles)) > 1
    assert mixed >= 1


def test_save_r2r_round_trips(tmp_path):
    from hf_rstitch.router.r2r import save_r2r

    _, slm = make_pair("llama")
    state = their_state(32, 32, True, seed=3)
    router = load_r2r(save_their_router(tmp_path / "r", state, 32, 0.4, normalize=True), slm)
    path = save_r2r(router, tmp_path / "again" / "router.pt", "tiny/slm")
    saved = torch.load(path, weights_only=True)
    assert saved["model_type"] == R2R_TYPE and saved["init_args"]["hidden_dims"] == DIMS
    assert sorted(saved["state_dict"]) == sorted(state)  # their names, exactly
    assert all(torch.equal(saved["state_dict"][k], state[k].float()) for k in state)
    assert load_r2r(path, slm).threshold == 0.4
