"""What every decoding method of the harness is: the :class:`Method` interface, the decoding settings a run
shares (:class:`GenSettings`) and how a method's parameter is written in record keys (:func:`param_text`).

The methods themselves: the baselines and the registry in :mod:`hf_rstitch.eval.methods`, the stitched ones in
:mod:`hf_rstitch.eval.stitched_methods`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch


def param_text(x: float) -> str:
    """A method parameter as written in record keys: ``%g`` where that is exact (``0.02``,
    ``1e-05``), else the shortest exact form (``0.001000001``), so two values never share a key."""
    short = f"{x:g}"
    return short if float(short) == x else repr(float(x))


@dataclass(frozen=True)
class GenSettings:
    """Decoding settings shared by every method of one run."""

    max_new_tokens: int = 8192
    do_sample: bool = False
    temperature: float = 0.6
    top_p: float = 0.95
    seed: int = 0

    def kwargs(self) -> dict[str, Any]:
        kw: dict[str, Any] = {"max_new_tokens": self.max_new_tokens, "do_sample": self.do_sample}
        if self.do_sample:
            kw.update(temperature=self.temperature, top_p=self.top_p)
        else:  # silence checkpoint sampling defaults under greedy decoding
            kw.update(temperature=None, top_p=None, top_k=None)
        return kw


class Method:
    """Base: subclasses set ``kind`` and implement :meth:`_generate`."""

    kind: ClassVar[str] = ""
    label_text: ClassVar[str] = ""
    one_row: ClassVar[bool] = False  # runs one prompt per generate call (batched harnesses send it rows alone)
    param: float | None = None

    def __init__(self, llm: Any, slm: Any, settings: GenSettings):
        self.llm, self.slm, self.settings = llm, slm, settings

    @property
    def name(self) -> str:
        """Record key: ``rstitch@0.02``, ``random@0.5``, ``llm``... (the parameter exactly)."""
        return self.kind if self.param is None else f"{self.kind}@{param_text(self.param)}"

    @property
    def label(self) -> str:
        return self.label_text

    def _generate(self, input_ids: torch.Tensor, **gen: Any) -> Any:
        raise NotImplementedError

    def _counts(self, out: Any, row: int, n_new: int) -> dict[str, Any]:
        return {"new_tokens": n_new, "llm_tokens": n_new, "slm_tokens": 0, "switches": 0}

    def _row_length(self, out: Any, row: int, new: list[int]) -> int:
        """New tokens of ``row`` before the padding of a batch: up to and including its first EOS."""
        eos = set(eos_ids(self.llm, self.slm))
        return next((i + 1 for i, t in enumerate(new) if t in eos), len(new))

    def run(self, input_ids: torch.Tensor, max_new_tokens: int | None = None) -> tuple[list[int], dict[str, Any]]:
        """Decode one prompt. ``input_ids``: ``[1, S]`` on the models' device."""
        return self.run_batch(input_ids, torch.ones_like(input_ids), max_new_tokens)[0]

    def run_batch(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, max_new_tokens: int | None = None,
                  **extra: Any) -> list[tuple[list[int], dict[str, Any]]]:
        """Decode a left-padded batch in one ``generate`` call. ``input_ids`` / ``attention_mask``:
        ``[B, S]`` on the models' device; ``extra`` goes to ``generate`` (e.g. ``pad_token_id``).
        Returns ``(new_token_ids, counts)`` per row; a row of a batch ends at its EOS."""
        gen = {**self.settings.kwargs(), **extra}
        if max_new_tokens is not None:  # warm-up calls
            gen["max_new_tokens"] = max_new_tokens
        if self.settings.do_sample:
            torch.manual_seed(self.settings.seed)
        with torch.inference_mode():
            out = self._generate(input_ids, attention_mask=attention_mask, return_dict_in_generate=True, **gen)
        news = out.sequences[:, input_ids.shape[1]:].tolist()
        if len(news) > 1:  # rows that finished early are padded up to the longest
            news = [new[: self._row_length(out, r, new)] for r, new in enumerate(news)]
        return [(new, self._counts(out, r, len(new))) for r, new in enumerate(news)]

    def engine_spec(self) -> dict[str, Any] | None:
        """How :class:`~hf_rstitch.batching.RequestEngine` runs this method (``policy=`` for the engine,
        ``role=`` for each request), or None when it runs through ``generate`` at batch size 1 only."""
        return None

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name})"


def eos_ids(*models: Any) -> set[int]:
    """The EOS ids of the models' generation configs."""
    ids: set[int] = set()
    for m in models:
        eos = getattr(getattr(m, "generation_config", None), "eos_token_id", None)
        ids.update([eos] if isinstance(eos, int) else (eos or []))
    return ids
