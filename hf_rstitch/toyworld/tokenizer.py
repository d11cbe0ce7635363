"""The toy world's shared tokenizer: a small word-level vocabulary built with ``tokenizers``.

Words keep their leading space (`` apples``), digits are one token each (`` 4``, ``7``) so
column arithmetic is learnable, punctuation is one token. Decoding fuses the pieces back
without inserting spaces, so ``decode(encode(text)) == text`` for any text the generator
writes. The vocabulary is built from generated rows of both styles, so it covers every word
the toy world uses; anything else maps to ``<|unk|>``.

Pieces are stored in GPT-2's byte-level alphabet (`` apples`` as ``Ġapples``, a newline as ``Ċ``) with
the ``ByteLevel`` pre-tokenizer and decoder: the ids and the text are those of the plain pieces, and
transformers reads every token's bytes from its string, which stop strings
(:class:`transformers.StopStringCriteria`) need from a vocabulary without single letters.

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


def byte_level(piece: str) -> str:
    """``piece`` in GPT-2's byte-level alphabet (`` 4`` -> ``Ġ4``); special tokens are printable ASCII and stay."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    alphabet = bytes_to_unicode()
    return "".join(alphabet[b] for b in piece.encode("utf-8"))


def build_tokenizer(texts: Iterable[str]):
    """A :class:`transformers.PreTrainedTokenizerFast` over the pieces of ``texts``: piece ``i`` of
    :func:`build_vocab` is token ``i``, stored byte-level (:func:`byte_level`)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {byte_level(tok): i for i, tok in enumerate(build_vocab(texts))}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    core.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(PIECE_PATTERN), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    core.decoder = decoders.ByteLevel()
    tok = PreTrainedTokenizerFast(
        tokenizer_object=core, bos_token=BOS, eos_token=EOS, unk_token=UNK, pad_token=PAD,
        additional_special_tokens=[USER, ASSISTANT], padding_side="left",
    )
    tok.chat_template = CHAT_TEMPLATE
    return tok


def default_texts(seed: int = 0, n_rows: int = 3000) -> list[str]:
    """The texts the toy world's vocabulary is built from: ``n_rows`` generated rows of each style."""
    from hf_rstitch.toyworld.tasks import make_split

    texts = []
    for style in ("concise", "verbose"):
        for row in make_split("train", n_rows, seed, style=style, unique=False):
            texts += [row["problem"], row["reasoning"]]
    return texts


def build_default_tokenizer(seed: int = 0, n_rows: int = 3000):
    """The toy world's tokenizer (the shipped pair's), built from :func:`default_texts`."""
    return build_tokenizer(default_texts(seed, n_rows))


def prompt_text(tokenizer, problem: str) -> str:
    """The chat-formatted prompt that asks the assistant to solve ``problem``."""
    return tokenizer.apply_chat_template([{"role": "user", "content": problem}], tokenize=False,
                                         add_generation_prompt=True)
