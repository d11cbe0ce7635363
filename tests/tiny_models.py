"""Tiny seeded random causal LMs of several architectures, built in-process (no downloads).

``initializer_range`` is large so next-token distributions are peaked and normalized
entropies spread over (0, 1): thresholds in between then produce real switches. Models are
float64 so cached and uncached forwards agree to ~1e-15 and routes never flip on noise.
"""

from __future__ import annotations

import torch
from transformers import (
    Gemma3ForCausalLM,
    Gemma3TextConfig,
    LlamaConfig,
    LlamaForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
)

VOCAB = 96
SPECIAL = {"bos_token_id": 0, "eos_token_id": 1, "pad_token_id": 2}


def _llama(hidden: int, layers: int, vocab: int) -> LlamaForCausalLM:
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=2, initializer_range=0.35, **SPECIAL)
    return LlamaForCausalLM(cfg)


def _qwen2(hidden: int, layers: int, vocab: int) -> Qwen2ForCausalLM:
    # sliding window of 6 on every layer: prompts + generations run well past it
    cfg = Qwen2Config(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=2, initializer_range=0.35, use_sliding_window=True,
                      sliding_window=6, max_window_layers=0, **SPECIAL)
    return Qwen2ForCausalLM(cfg)


def _qwen2_full(hidden: int, layers: int, vocab: int) -> Qwen2ForCausalLM:
    cfg = Qwen2Config(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=2, initializer_range=0.35, **SPECIAL)
    return Qwen2ForCausalLM(cfg)


def _gemma3(hidden: int, layers: int, vocab: int) -> Gemma3ForCausalLM:
    cfg = Gemma3TextConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                           num_attention_heads=4, num_key_value_heads=2, head_dim=hidden // 4, initializer_range=0.15 * (64 / hidden),
                           sliding_window=5, sliding_window_pattern=2, **SPECIAL)
    return Gemma3ForCausalLM(cfg)


BUILDERS = {"llama": _llama, "qwen2": _qwen2, "gemma3": _gemma3, "qwen2-full": _qwen2_full}
ARCHS = ["llama", "qwen2", "gemma3"]  # equivalence tests at batch size 1
BATCH_ARCHS = ["llama", "qwen2", "gemma3", "qwen2-full"]  # qwen2: sliding window everywhere; gemma3: hybrid


def make_model(arch: str, hidden: int, layers: int, seed: int, vocab: int = VOCAB):
    torch.manual_seed(seed)
    model = BUILDERS[arch](hidden, layers, vocab).double().eval()
    model.generation_config.update(**SPECIAL)
    return model


def make_pair(arch: str, seed: int = 0, slm_vocab: int = VOCAB, llm_vocab: int = VOCAB):
    """(llm, slm) of one architecture; the LLM is wider and deeper."""
    llm = make_model(arch, 64, 3, seed, llm_vocab)
    slm = make_model(arch, 32, 2, seed + 1000, slm_vocab)
    return llm, slm


def prompt(length: int = 9, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, VOCAB, (1, length), generator=g)


def make_tokenizer(vocab: int = VOCAB):
    """Character-level tokenizer: ids 0-2 are <s> </s> <pad>, then one id per printable character."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    chars = [chr(c) for c in range(32, 32 + vocab - 3)]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(["<s>", "</s>", "<pad>"] + chars)}, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>")


def left_pad(prompts: list[torch.Tensor], pad: int = 2) -> tuple[torch.Tensor, torch.Tensor]:
    """``[1, T_i]`` prompts -> left-padded ``ids [B, T]`` and ``mask [B, T]``."""
    width = max(p.shape[1] for p in prompts)
    ids = torch.full((len(prompts), width), pad)
    mask = torch.zeros(len(prompts), width, dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, width - p.shape[1]:] = p[0]
        mask[i, width - p.shape[1]:] = 1
    return ids, mask


def kernel_model(device, arch: str = "llama"):
    """A float32 Llama (no projection biases) or Qwen2 (q/k/v biases) for the fast engine's kernel tests:
    default initialisation, 64 wide, two layers, 97 ids (a size no kernel block divides)."""
    torch.manual_seed(0)
    config, model = (LlamaConfig, LlamaForCausalLM) if arch == "llama" else (Qwen2Config, Qwen2ForCausalLM)
    cfg = config(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2)
    return model(cfg).to(device).eval()


def assert_compiles_like_eager(model, patches, device) -> None:
    """A one-token forward with ``patches`` installed, through ``torch.compile(fullgraph=True)``, equals
    the model's own eager forward (the kernels' custom ops trace)."""
    from hf_rstitch.fast.patches import linears

    one = torch.randint(0, 97, (1, 1), device=device)
    step = torch.compile(lambda ids: model(ids).logits, fullgraph=True)
    with torch.no_grad(), linears.gemv_linears_on(patches):
        got = step(one)
    with torch.no_grad():
        torch.testing.assert_close(got, model(one).logits, atol=1e-4, rtol=1e-4)


def assert_wide_tier_runs(model, patches, device) -> None:
    """With ``patches`` (tuned for 64 rows) installed, an input of 17..64 rows gives the model's own logits
    to float32 rounding (the wide tier), and one of more rows exactly its own (the module's forward)."""
    from hf_rstitch.fast.kernels import gemv
    from hf_rstitch.fast.patches import linears

    wide, past = (torch.randint(0, 97, (1, n), device=device) for n in (gemv.MAX_ROWS + 3, gemv.WIDE_ROWS + 3))
    with torch.no_grad():
        want = [model(ids).logits for ids in (wide, past)]
        with linears.gemv_linears_on(patches):
            got = [model(ids).logits for ids in (wide, past)]
    torch.testing.assert_close(got[0], want[0], atol=1e-4, rtol=1e-4)
    assert torch.equal(got[1], want[1])


class Shown:
    """A streamer keeping every tensor ``generate`` gives it (the prompt first), as ``generate`` passes them."""

    def __init__(self):
        self.puts = []

    def put(self, value):
        self.puts.append(value.clone())

    def end(self):
        pass
