"""Tiny random pairs of every causal LM that transformers ships: the zoo the fast engine is proven over.

Every ``model_type`` of ``MODEL_FOR_CAUSAL_LM_MAPPING_NAMES`` (the installed transformers) is built
from its own default configuration (``CONFIG_MAPPING[model_type]()``) with every size shrunk -- width,
depth, heads, KV heads, head size, feed-forward, experts, windows, vocabulary -- into an LLM (64
wide, 3 layers) and an SLM (32 wide, 2 layers) of the same vocabulary, float32, random weights; nested
configurations (``text_config``, ``vision_config``, ``audio_config``, ...) are shrunk the same way, so a
multimodal model is built whole and decodes text-only prompts. No per-architecture code: what a type needs
beyond the generic shrink is data in :data:`OVERRIDES` (configuration fields, :class:`PerRole` where the LLM
and SLM need different values); what cannot be built as a text-only decoder pair is listed with its
reason in :data:`EXCLUDED` (one place), and :func:`build_pair` raises :class:`NotBuildable` for anything
else that fails.

Used by the conformance suite (``tests/zoo``) and the GPU lab script (``benchmarks/zoo.py``).
"""

from __future__ import annotations

import warnings

import torch

VOCAB = 128
SPECIAL = {"bos_token_id": 0, "eos_token_id": 1, "pad_token_id": 2}

# (LLM, SLM) values of every size attribute a default configuration may carry; absent ones are left alone
SIZES = {
    ("hidden_size", "n_embd", "d_model", "embed_dim", "dim", "emb_dim", "hidden_size_global"): (64, 32),
    ("num_hidden_layers", "n_layer", "num_layers", "n_layers", "decoder_layers"): (3, 2),
    ("num_attention_heads", "n_head", "num_heads", "n_heads", "decoder_attention_heads", "attention_heads",
     "swa_num_attention_heads"): (4, 2),
    ("num_key_value_heads", "num_kv_heads", "multi_query_group_num", "num_query_groups",
     "swa_num_key_value_heads"): (2, 1),
    ("head_dim", "swa_head_dim", "attention_head_dim", "kv_channels", "d_head", "dim_head", "attention_head_size",
     "qk_head_dim", "v_head_dim", "linear_key_head_dim", "linear_value_head_dim", "linear_head_dim",
     "mamba_d_head", "mamba_head_dim", "mamba_headdim"): (16, 16),
    ("intermediate_size", "n_inner", "ffn_dim", "decoder_ffn_dim", "ffn_hidden_size", "intermediate_size_mlp",
     "dense_intermediate_size", "feed_forward_size", "dim_ff", "dff"): (128, 64),
    ("moe_intermediate_size", "shared_expert_intermediate_size", "shared_intermediate_size",
     "expert_ffn_hidden_size", "moe_shared_expert_intermediate_size", "shared_experts_intermediate_size"): (32, 16),
    ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts"): (4, 4),
    ("num_experts_per_tok", "moe_topk", "top_k_experts", "num_experts_per_token"): (2, 2),
    ("kv_lora_rank",): (16, 16),
    ("q_lora_rank",): (32, 16),
    ("qk_rope_head_dim", "qk_nope_head_dim"): (8, 8),
    ("linear_num_key_heads", "linear_num_value_heads", "linear_num_heads", "mamba_n_heads", "mamba_num_heads",
     "index_n_heads"): (2, 2),
    ("mamba_d_state", "state_size", "ssm_state_size", "index_head_dim"): (16, 16),
    ("hidden_size_per_layer_input", "laurel_rank", "lru_width", "attention_hidden_size"): (16, 16),
    ("vocab_size", "vocab_size_per_layer_input", "unpadded_vocab_size"): (VOCAB, VOCAB),
}
DERIVED = ("head_dim", "num_key_value_heads")  # None in some defaults ("derive it"): set too, as some layers read them
# shrunk only when the default sets them (a None window means none): windows shorter than a test's trace
WINDOWS = ("sliding_window", "sliding_window_size", "attention_window_size", "local_attention_window_len")
WINDOW = 4
MAX_PARAMETERS = 4_000_000
LONGEST = 256  # max_position_embeddings and the like, when larger
POSITIONS = ("max_position_embeddings", "n_positions", "n_ctx", "max_seq_len", "context_length")
# a few fields whose defaults assume the full-size model
FIXED = {"is_decoder": True, "n_group": 1, "num_expert_group": 1, "topk_group": 1, "first_k_dense_replace": 1,
         "per_layer_config": {}, "initializer_range": 0.1,
         "use_cache": True, "tie_word_embeddings": False}



class PerRole(tuple):
    """An override's ``(LLM, SLM)`` values, where one value cannot fit both sizes."""


# per-architecture overrides, applied last (to both models of the pair; a dict updates a nested configuration)
_ROPE_HEAD = {"head_dim": 8}  # latent attention: the rotary part of a head (qk_rope_head_dim) is head_dim
_MAMBA = {"mamba_expand": 1, "mamba_n_heads": PerRole((4, 2))}  # mamba heads x head size == expand x width
_ZAMBA = {"attention_hidden_size": PerRole((128, 64)), "attention_head_dim": 32}  # attends over [x, embeddings]
_INDEXER = {"indexer_budget": 8, "indexer_compress_ratio": 2, "indexer_n_heads": 2, "indexer_kv_heads": 1,
            "indexer_head_dim": 16}
OVERRIDES: dict[str, dict] = {
    "codegen": {"rotary_dim": 8}, "gptj": {"rotary_dim": 8},
    "deepseek_v3": _ROPE_HEAD, "deepseek_v32": _ROPE_HEAD, "longcat_flash": _ROPE_HEAD, "youtu": _ROPE_HEAD,
    "axk1": _ROPE_HEAD, "axk2": _ROPE_HEAD,
    "deepseek_v2": {**_ROPE_HEAD, "num_experts_per_tok": 2},
    "ernie4_5_moe": {"moe_k": 2},
    "bamba": {**_MAMBA, "attn_layer_indices": [1]}, "falcon_h1": {**_MAMBA, "mamba_d_ssm": PerRole((64, 32))},
    "granitemoehybrid": {**_MAMBA, "layer_types": PerRole((["linear_attention", "full_attention", "linear_attention"],
                                                           ["linear_attention", "full_attention"]))},
    "blt": {"encoder_hash_byte_group_vocab": VOCAB},
    "cohere_compass_text": {"rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 10000.0}}},
    "dbrx": {"attn_config": {"rope_theta": 10000.0, "clip_qkv": 8.0}},
    "diffllama": {"num_key_value_heads": 2},  # differential attention splits the KV heads in two
    "dory": {"layer_types": PerRole((["sliding_attention", "full_attention", "sliding_attention"],
                                     ["sliding_attention", "full_attention"])),
             "n_input_layers": 1, "n_recurrent_layers": PerRole((1, 0)), "n_output_layers": 1},  # (its dict: doubled)
    "dots3_note": {"vision_config": {"adapter_in_dim": PerRole((64, 32)), "adapter_out_dim": PerRole((64, 32))},
                   "audio_config": {"adapter_input_size": PerRole((64, 32)), "adapter_out_dim": PerRole((64, 32))}},
    "dots1": {"n_routed_experts": 4, "n_shared_experts": 1, "num_experts_per_tok": 2},
    "gpt_neo": {"attention_types": PerRole(([[["global", "local"], 1], [["global"], 1]], [[["global", "local"], 1]]))},
    "gemma3n_text": {"num_kv_shared_layers": 0, "intermediate_size": PerRole(([128] * 3, [64] * 2)),
                     "activation_sparsity_pattern": PerRole(([0.95, 0.0, 0.0], [0.95, 0.0]))},
    "jamba": {"attn_layer_period": 2, "attn_layer_offset": 1, "expert_layer_period": 2, "expert_layer_offset": 1},
    "recurrent_gemma": {"block_types": ["recurrent", "attention"]},
    "lfm2_moe": {"num_dense_layers": 1, "layer_types": PerRole((["conv", "full_attention", "conv"],
                                                                ["conv", "full_attention"]))},
    "mamba2": {"expand": 1, "n_groups": 1},
    "nemotron_h": {"n_groups": 1, "expand": 1, "mamba_num_heads": PerRole((4, 2))},
    "reformer": {"axial_pos_embds_dim": PerRole(([32, 32], [16, 16])), "axial_pos_shape": [16, 16],
                 "attn_layers": PerRole((["local", "lsh", "local"], ["local", "lsh"]))},
    "roc_bert": {"pronunciation_embed_dim": 16, "shape_embed_dim": 16, "pronunciation_vocab_size": VOCAB,
                 "shape_vocab_size": VOCAB},
    "rwkv": {"attention_hidden_size": PerRole((64, 32))},
    "xlstm": {"embedding_dim": PerRole((64, 32))},
    "phi4_multimodal": {"audio_config": {"num_blocks": 1, "ext_pw_out_channel": PerRole((64, 32)),
                                         "depthwise_separable_out_channel": 64, "nemo_conv_channels": 64}},
    "qwen4_exp": {"text_config": _INDEXER}, "qwen4_exp_text": _INDEXER,
    "xmod": {"default_language": "en_XX"},
    "zamba": _ZAMBA,
    "zamba2": {**_ZAMBA, "hybrid_layer_ids": PerRole(([2], [1])), "n_mamba_heads": PerRole((8, 4))},  # (the cut's)
    "zaya": {"num_experts_per_tok": 1},
}

# what cannot be built as a tiny text-only decoder pair, and why: the one list (transformers 5.24; tests/zoo skips them,
# benchmarks/zoo.py reports them)
_ENCODER_DECODER = "an encoder-decoder model, not a decoder-only causal LM"
_STATE = ("state-space layers only: its cache holds no attention layer, and the eager engine's lanes, which ask "
          "the cache for its length, fail on it (ValueError: `get_seq_length` can only be called on Attention layers)")
_DEPENDENCY = "needs an optional dependency that is not installed (timm)"
_DRAFTER = ("a drafter for a Gemma 4 backbone, not a standalone LM: every layer reads the backbone's KV cache "
            "(num_kv_shared_layers = num_hidden_layers); a model of its own fails with 'The set of layer types "
            "producing a cache is different than the set of layer types using them'")
EXCLUDED: dict[str, str] = {
    **dict.fromkeys(["bart", "bigbird_pegasus", "blenderbot", "blenderbot-small", "marian", "mbart", "musicgen",
                     "musicgen_melody", "mvp", "pegasus", "plbart", "prophetnet", "whisper"], _ENCODER_DECODER),
    **dict.fromkeys(["falcon_mamba", "mamba", "mamba2"], _STATE),
    "minimax": "the eager engine itself fails on it: MiniMax refuses any cache but its own (ValueError: MiniMax uses "
               "cache of its own and is not compatible with `cache` of type DynamicCache)",
    **dict.fromkeys(["gemma3n"], _DEPENDENCY),
    "cpmant": "the eager engine itself fails on it (RuntimeError: The size of tensor a (41) must match the size of "
              "tensor b (33) at non-singleton dimension 3)",
    "xlm": "the eager engine itself fails on it: XLM's attention builds its mask from the cache's length, empty over "
           "a DynamicCache lane (RuntimeError: The expanded size of the tensor (9) must match the existing size (0))",
    "gemma4_assistant": _DRAFTER + " (and its default configuration fails its own validator: "
                                   "hidden_size_per_layer_input must be 0, got 256)",
    "gemma4_unified_assistant": _DRAFTER,
    "blt": "a byte-latent model (patcher, local encoder and decoder over byte n-gram hashes, a global model): its "
           "forward reads config.num_hidden_layers, which BltConfig does not have (AttributeError)",
    "xlstm": "recurrent layers with a state of their own; the shrunk model's forward fails in its mLSTM step "
             "(ValueError: matC_old has wrong shape, got [1, 4, 16, 16]: the state's shape it checks against is not "
             "derived from the shrunk sizes; no override found yet)",
}


class NotBuildable(Exception):
    """This model_type cannot be built as a tiny random decoder-only pair (the message says why)."""


def zoo() -> list[str]:
    """Every model_type of the installed transformers' causal-LM mapping, sorted."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)


def tiny_config(model_type: str, role: int = 0, **overrides):
    """The default configuration of ``model_type`` with every size shrunk (``role`` 0: the LLM, 1: the SLM)."""
    from transformers import CONFIG_MAPPING

    cls = CONFIG_MAPPING[model_type]
    try:
        base = cls().to_dict()
    except Exception as err:  # noqa: BLE001  (its defaults do not even validate)
        raise NotBuildable(f"its default configuration does not build ({type(err).__name__}: {_first(err)})")
    if base.get("is_encoder_decoder"):
        raise NotBuildable("encoder-decoder model")
    values = _shrunk(base, role, cls)
    values.update(SPECIAL)
    for name, value in {**OVERRIDES.get(model_type, {}), **overrides}.items():  # a dict updates a nested config
        value = _for(role, value)
        values[name] = {**values[name], **value} if isinstance(value, dict) and name in values else value
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return cls(**values)
    except Exception as err:  # noqa: BLE001  (a validator rejects the shrunk sizes)
        raise NotBuildable(f"its shrunk configuration does not validate ({type(err).__name__}: {_first(err)})")


def _shrunk(base: dict, role: int, cls=None) -> dict:
    """The fields of a configuration's dict to change: every size shrunk, windows and positions cut, the fixed
    fields set; nested configurations (``text_config``, ``vision_config``, ...) shrunk the same way."""
    values = {}
    for names, sizes in SIZES.items():
        for name in names:
            value = base.get(name)
            derived = value is None and name in DERIVED and not isinstance(getattr(cls, name, None), property)
            if isinstance(value, int) and not isinstance(value, bool) or derived:
                values[name] = sizes[role]
    for name in WINDOWS:
        if isinstance(base.get(name), int) and not isinstance(base.get(name), bool):
            values[name] = WINDOW
    for name in POSITIONS:
        if isinstance(base.get(name), int) and base[name] > LONGEST:
            values[name] = LONGEST
    values.update({k: v for k, v in FIXED.items() if k in base})
    if "kv_lora_rank" in base and "num_attention_heads" in values:  # latent attention: one KV head per head
        values["num_key_value_heads"] = values["num_attention_heads"]
    depth = base.get("num_hidden_layers")
    for name, kinds in base.items():  # layer_types, mlp_layer_types, ...: one entry a layer
        per_layer = name == "layer_types" or isinstance(kinds, list) and len(kinds) == depth
        if name.endswith(("layer_types", "layers_block_type")) and isinstance(kinds, list) and per_layer:
            values[name] = _layer_types(kinds, values.get("num_hidden_layers", 3))
    for name, sub in base.items():
        if isinstance(sub, dict) and "model_type" in sub:  # a nested configuration, passed back whole
            values[name] = {**sub, **_shrunk(sub, role), **(SPECIAL if name == "text_config" else {})}
    return values


def _for(role: int, value):
    """An override's value for ``role`` (a nested configuration's values too)."""
    if isinstance(value, dict):
        return {k: _for(role, v) for k, v in value.items()}
    return value[role] if isinstance(value, PerRole) else value


def _layer_types(kinds: list, layers: int) -> list:
    """The default's layer kinds cut to ``layers``, every kind it has kept (the last layer takes the one
    the cut lost: a hybrid stays hybrid)."""
    out = list(kinds[:layers])
    lost = [k for k in dict.fromkeys(kinds) if k not in out]
    for i, kind in enumerate(lost[: layers - 1]):
        out[layers - 1 - i] = kind
    return out


def tiny_model(model_type: str, role: int, seed: int, **overrides):
    """One float32 model of the pair, in eval mode, its generation config's special ids set."""
    from transformers import AutoModelForCausalLM

    config = tiny_config(model_type, role, **overrides)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with torch.device("meta"):  # sized first: a size this builder does not shrink would build gigabytes
                size = sum(p.numel() for p in AutoModelForCausalLM.from_config(config).parameters())
            if size > MAX_PARAMETERS:
                raise NotBuildable(f"its shrunk model still has {size / 1e6:.0f}M parameters (a size attribute "
                                   "this builder does not shrink)")
            torch.manual_seed(seed)
            model = AutoModelForCausalLM.from_config(config, torch_dtype=torch.float32)
    except NotBuildable:
        raise
    except ImportError as err:
        raise NotBuildable(f"missing optional dependency ({_first(err)})")
    except Exception as err:  # noqa: BLE001
        raise NotBuildable(f"the model does not build from its shrunk configuration ({type(err).__name__}: "
                           f"{_first(err)})")
    model = model.float().eval()
    model.generation_config.update(**SPECIAL)
    return model


def build_pair(model_type: str, seed: int = 0, **overrides):
    """``(llm, slm)``: tiny random float32 models of ``model_type`` (the LLM wider and deeper), on the CPU.
    ``overrides``: configuration fields set on both. Raises :class:`NotBuildable` (with the reason) when it cannot
    be built or run as a text-only decoder."""
    if model_type in EXCLUDED:
        raise NotBuildable(EXCLUDED[model_type])
    llm, slm = tiny_model(model_type, 0, seed, **overrides), tiny_model(model_type, 1, seed + 1000, **overrides)
    for model in (llm, slm):
        try:
            with torch.no_grad():
                model(input_ids=torch.tensor([[3, 4, 5]]))
        except Exception as err:  # noqa: BLE001
            raise NotBuildable(f"a text-only forward fails ({type(err).__name__}: {_first(err)})")
    return llm, slm


def _first(err: Exception) -> str:
    return str(err).strip().splitlines()[0][:200] if str(err).strip() else type(err).__name__


# ---- the conformance cases: the same for the CPU suite and the GPU lab script ----------------------------
NEW_TOKENS = 8
CASES = (("greedy", 1), ("greedy", 3), ("sample", 1), ("sample", 3))  # (decoding, batch rows)
LENGTHS = (9, 5, 7)  # prompt lengths of a batch's rows (left padded to the longest)


def prompts(batch: int, device="cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """``ids [B, T]`` and ``mask [B, T]``: ``batch`` seeded random prompts, left padded."""
    g = torch.Generator().manual_seed(batch)
    rows = [torch.randint(3, VOCAB, (n,), generator=g) for n in LENGTHS[:batch]]
    width = max(len(r) for r in rows)
    ids = torch.full((batch, width), SPECIAL["pad_token_id"])
    mask = torch.zeros(batch, width, dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, width - len(r):], mask[i, width - len(r):] = r, 1
    return ids.to(device), mask.to(device)


@torch.no_grad()
def pick_threshold(slm, quantile: float = 0.5) -> float:
    """A threshold at which routes mix: the ``quantile`` of the SLM's normalized entropies over its own greedy
    continuations of the suite's prompts, moved to the middle of the gap to the next entropy (no near-ties)."""
    from hf_rstitch.core.entropy import normalized_entropy

    ids, mask = prompts(3, slm.device)
    seq = slm.generate(ids, attention_mask=mask, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS,
                       do_sample=False, pad_token_id=SPECIAL["pad_token_id"])
    full = torch.cat([mask, torch.ones(seq.shape[0], seq.shape[1] - ids.shape[1], dtype=mask.dtype,
                                       device=mask.device)], dim=1)
    logits = slm(input_ids=seq, attention_mask=full).logits[:, ids.shape[1] - 1:-1].float()
    values = normalized_entropy(logits).flatten().double().sort().values
    i = min(int(quantile * len(values)), len(values) - 2)
    return float((values[i] + values[i + 1]) / 2)


def stitched(llm, slm, decoding: str, batch: int, threshold: float, engine, seed: int = 0):
    """One stitched ``generate`` of the suite: ``(sequences [B, T], roles per row)``."""
    ids, mask = prompts(batch, llm.device)
    torch.manual_seed(seed)
    out = llm.generate(ids, attention_mask=mask, assistant_model=slm, stitch_threshold=threshold,
                       stitch_engine=engine, max_new_tokens=NEW_TOKENS, do_sample=decoding == "sample",
                       return_dict_in_generate=True)
    traces = out.stitch if isinstance(out.stitch, list) else [out.stitch]
    return out.sequences, [[str(r) for r in t.roles] for t in traces]


NEAR_CASES = (("greedy", 3), ("sample", 3))  # "auto" at thresholds next to observed entropies


def observed_entropies(llm, slm, decoding: str, batch: int, threshold: float, seed: int = 0) -> list[float]:
    """The SLM entropies the eager engine saw in one stitched ``generate`` of the suite (every row)."""
    ids, mask = prompts(batch, llm.device)
    torch.manual_seed(seed)
    out = llm.generate(ids, attention_mask=mask, assistant_model=slm, stitch_threshold=threshold,
                       stitch_engine="default", max_new_tokens=NEW_TOKENS, do_sample=decoding == "sample",
                       return_dict_in_generate=True)
    traces = out.stitch if isinstance(out.stitch, list) else [out.stitch]
    return [h for t in traces for h in t.slm_entropies if h is not None]


def clear_of_ties(llm, slm, decoding: str, batch: int, threshold: float, margin: float) -> bool:
    """Whether the eager engine's own run at ``threshold`` (one of :func:`near_thresholds`, ``margin`` from an
    entropy) meets no SLM entropy within ``margin / 2`` of it. :func:`near_thresholds` keeps ``margin`` from the
    entropies of the run it was drawn from, but a run at the new threshold may route otherwise and meet new
    entropies; one that close is a tie that an engine differing by a fraction of ``margin`` may break either way,
    so a threshold where the eager run meets one decides nothing. (Half: the entropy the threshold was drawn from
    is met again ``margin`` away, give or take the rounding of ``h + margin``.)"""
    seen = observed_entropies(llm, slm, decoding, batch, threshold)
    return all(abs(h - threshold) >= margin / 2 for h in seen)


def near_thresholds(entropies: list[float], margin: float | None = None) -> list[float]:
    """Thresholds just above and just below the first and the median of ``entropies`` (what the eager engine saw):
    ``margin`` away, None: one float32 step (``torch.nextafter``). An engine whose entropy there differs by more
    than that from the eager engine's hands over where the eager engine does not (or the reverse): a bit-equal
    engine passes at one step, any other needs the margin it differs by."""
    if not entropies:
        return []
    picked = sorted({entropies[0], sorted(entropies)[len(entropies) // 2]})
    out = []
    for h in picked:
        value = torch.tensor(h, dtype=torch.float32)
        for sign in (1.0, -1.0):
            if margin is None:
                out.append(float(torch.nextafter(value, torch.tensor(sign * float("inf")))))
            else:
                out.append(h + sign * margin)
    return out


def request_pair(model_type: str):
    """``(llm, slm, threshold)`` of ``model_type`` for the request engine's zoo tests: skipped where this
    transformers lacks it, built with its configs' warnings silenced, at a threshold where routes mix."""
    import pytest

    if model_type not in zoo():
        pytest.skip(f"{model_type} is not in this transformers")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        llm, slm = build_pair(model_type)
    return llm, slm, pick_threshold(slm)
