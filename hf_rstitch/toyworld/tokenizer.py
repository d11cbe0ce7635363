"""The toy world's shared tokenizer: a small word-level vocabulary built with ``tokenizers``.

Words keep their leading space (`` apples``), digits are one token each (`` 4``, ``7``) so
column arithmetic is learnable, punctuation is one token. Decoding fuses the pieces back
without inserting spaces, so ``decode(encode(text)) == text`` for any text the generator
writes. The vocabulary is built from generated rows of both styles, so it covers every word
the toy world uses; anything else maps to ``<|unk|>``.

Chat format (the template is saved with the tokenizer)::

    <|user|>{problem}<|end|><|assistant|>{reasoning}<|end|>

``<|end|>`` is EOS; ``<|pad|>`` pads.
"""

from __future__ import annotations

from collections import Counter
from typing import Iterable

PAD, UNK, BOS, EOS = "<|pad|>", "<|unk|>", "<|bos|>", "<|end|>"
USER, ASSISTANT = "<|user|>", "<|assistant|>"
SPECIAL_TOKENS = [PAD, UNK, BOS, EOS, USER, ASSISTANT]
# One piece per word (with its leading space), digit, newline or punctuation mark.
PIECE_PATTERN = r" ?[A-Za-z]+| ?[0-9]|\n| ?[^\sA-Za-z0-9]| +"

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] == 'user' %}" + USER + "{{ message['content'] }}" + EOS +
    "{% elif message['role'] == 'assistant' %}" + ASSISTANT + "{{ message['content'] }}" + EOS +
    "{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}" + ASSISTANT + "{% endif %}"
)


def _pieces(text: str) -> list[str]:
    import re

    return re.findall(PIECE_PATTERN, text)


def build_vocab(texts: Iterable[str]) -> list[str]:
    """Special tokens, then every digit (bare and with a space), then pieces by frequency."""
    counts: Counter[str] = Counter()
    for text in texts:
        counts.update(_pieces(text))
    base = [str(d) for d in range(10)] + [f" {d}" for d in range(10)]
    rest = sorted((p for p in counts if p not in base), key=lambda p: (-counts[p], p))
    return SPECIAL_TOKENS + base + rest


def build_tokenizer(texts: Iterable[str]):
    """A :class:`transformers.PreTrainedTokenizerFast` over the pieces of ``texts``."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(build_vocab(texts))}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    core.pre_tokenizer = pre_tokenizers.Split(Regex(PIECE_PATTERN), behavior="isolated")
    core.decoder = decoders.Fuse()
    tok = PreTrainedTokenizerFast(
        tokenizer_object=core, bos_token=BOS, eos_token=EOS, unk_token=UNK, pad_token=PAD,
        additional_special_tokens=[USER, ASSISTANT], padding_side="left",
    )
    tok.chat_template = CHAT_TEMPLATE
    return tok


def build_default_tokenizer(seed: int = 0, n_rows: int = 3000):
    """The toy world's tokenizer, built from ``n_rows`` generated rows of each style."""
    from hf_rstitch.toyworld.tasks import make_split

    texts = []
    for style in ("concise", "verbose"):
        for row in make_split("train", n_rows, seed, style=style, unique=False):
            texts += [row["problem"], row["reasoning"]]
    return build_tokenizer(texts)


def prompt_text(tokenizer, problem: str) -> str:
    """The chat-formatted prompt that asks the assistant to solve ``problem``."""
    return tokenizer.apply_chat_template([{"role": "user", "content": problem}], tokenize=False,
                                         add_generation_prompt=True)
