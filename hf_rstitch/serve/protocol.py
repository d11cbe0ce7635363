"""The OpenAI request bodies the server accepts, and their translation into engine requests.

``ChatCompletionRequest`` and ``CompletionRequest`` follow the OpenAI schema for the fields that
stitched decoding can honour, plus one extra field, ``stitch_threshold`` (this request's R-Stitch
tau). Fields the server cannot honour (``n > 1``, penalties, ``logprobs``, tools, ...) are refused
with a message rather than ignored, and the published schema says which values they may take;
unknown fields are refused too, so a misspelt ``stitch_treshold`` does not silently decode at the
default. Types are strict: ``true`` is no integer, ``"yes"`` no boolean. Sampling: no
``temperature`` and no ``top_p`` means the LLM's generation config decides (greedy for the shipped
pair); ``temperature: 0`` is greedy; anything else samples. ``stop``: up to 4 strings; the text
ends before the first one (which is not returned), as OpenAI does.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, field_validator, model_validator

_UNSUPPORTED_HINT = ("this server decodes one choice per request with R-Stitch; drop the field or leave it at its "
                     "default")


_STRICT = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)  # NaN / Infinity: "a finite number"
MAX_INT_DIGITS = 4300  # Python's limit on the digits of an integer it reads from text (sys.get_int_max_str_digits)


class HugeInt:
    """What the body's reader puts where a JSON integer has more digits than Python reads (see
    :func:`~.bodies.read_json`), so that the field holding it is named in the 400."""

    def __init__(self, digits: str):
        self.digits = len(digits.lstrip("-"))

    def __repr__(self) -> str:
        return f"<an integer of {self.digits} digits>"


def _json_integer(value):
    """JSON Schema's integer: an int, or a float without a fraction (1.0); never a bool or a string."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, HugeInt):
        raise ValueError(f"an integer of {value.digits} digits; integers here have at most {MAX_INT_DIGITS}")
    return value


def _seed(value):
    if isinstance(value, HugeInt):
        raise ValueError(f"a seed of {value.digits} digits; a seed is any integer of at most {MAX_INT_DIGITS} digits, "
                         "taken modulo 2**64: send seed % 2**64 (a number in [0, 18446744073709551616))")
    return _json_integer(value)


def _unicode(text: str) -> str:
    """Text the tokenizer can encode: no lone UTF-16 surrogate (JSON's "\\ud800" escapes decode to one)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:
        raise ValueError(f"holds a lone UTF-16 surrogate {text[err.start]!r} at character {err.start}, which is not "
                         "Unicode text; send valid text (a surrogate pair, or the character itself)") from None
    return text


Int = Annotated[int, BeforeValidator(_json_integer)]  # strict otherwise: true is no integer
Text = Annotated[str, AfterValidator(_unicode)]  # text the tokenizer reads
Budget = Annotated[int, Field(ge=1), BeforeValidator(_json_integer)]  # max_tokens and the like (bound first: in the schema)
_Ids = Annotated[list[Annotated[int, Field(ge=0), BeforeValidator(_json_integer)]], Field(min_length=1)]  # token ids


def _only(*values) -> dict[str, Any]:
    """Schema extra of a field accepted only at OpenAI's default (the refusal names it; the schema says so)."""
    return {"json_schema_extra": {"enum": [*values, None]}}


class StreamOptions(BaseModel):
    model_config = _STRICT
    include_usage: bool = False


class StitchPolicySpec(BaseModel):
    """This request's own routing rule by name (:data:`hf_rstitch.core.policies_rows.POLICY_NAMES`):
    ``{"name": "step", "threshold": 0.3, "delimiter": "\\n\\n"}``, ``{"name": "rstitch", "threshold": 0.02}``,
    ``{"name": "random", "p": 0.2}``; on a server started with ``--router``, ``{"name": "router", "threshold": 0.05}``
    (its R-Stitch+ router at this tau) or ``{"name": "r2r", "threshold": 0.7}`` (its R2R router at this cut-off)."""

    model_config = _STRICT

    name: Literal["rstitch", "step", "random", "router", "r2r"]
    threshold: float | None = Field(default=None, ge=0.0, le=1.0, description=(
        "rstitch / step / router: the entropy tau; r2r: the router's probability cut-off"))
    delimiter: str | None = Field(default=None, min_length=1, max_length=16, description="step: text ending a step")
    p: float | None = Field(default=None, ge=0.0, le=1.0, description="random: share of SLM steps sent to the LLM")


class _Common(BaseModel):
    """Fields shared by both endpoints."""

    model_config = _STRICT

    model: str | None = Field(default=None, description="a name /v1/models lists (others: 404); none: the served model")
    max_tokens: Budget | None = None
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    seed: Annotated[int, BeforeValidator(_seed)] | None = Field(default=None, description=(
        "any integer (taken modulo 2**64): a reproducible draw"))
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    stitch_threshold: float | None = Field(
        default=None, ge=0.0, le=1.0, description="R-Stitch normalized-entropy threshold tau for this request")
    stitch_policy: StitchPolicySpec | None = Field(default=None, description=(
        "this request's routing rule by name and parameters, instead of stitch_threshold"))
    stop: str | Annotated[list[str], Field(max_length=4)] | None = Field(default=None, description=(
        "up to 4 strings; the completion ends before the first one, which is not returned"))
    # accepted only at their OpenAI defaults
    n: Int | None = Field(default=None, **_only(1))
    presence_penalty: float | None = Field(default=None, **_only(0))
    frequency_penalty: float | None = Field(default=None, **_only(0))
    logit_bias: dict[str, float] | None = Field(default=None, json_schema_extra={"maxProperties": 0})

    @model_validator(mode="after")
    def _refuse_unsupported(self):
        bad = []
        if self.n not in (None, 1):
            bad.append(f"n={self.n} (only n=1)")
        for name in ("presence_penalty", "frequency_penalty"):
            if getattr(self, name) not in (None, 0, 0.0):
                bad.append(f"{name}={getattr(self, name)}")
        if self.logit_bias:
            bad.append("logit_bias")
        if bad:
            raise ValueError(f"unsupported: {', '.join(bad)}; {_UNSUPPORTED_HINT}")
        return self

    def sampling(self, default_sample: bool, default_temperature: float, default_top_p: float) -> dict[str, Any]:
        """``do_sample / temperature / top_p`` for the engine request (see the module docstring)."""
        if self.temperature is None and self.top_p is None:
            return dict(do_sample=default_sample, temperature=default_temperature, top_p=default_top_p)
        temperature = default_temperature if self.temperature is None else self.temperature
        if temperature == 0.0:
            return dict(do_sample=False, temperature=1.0, top_p=1.0)
        return dict(do_sample=True, temperature=temperature, top_p=default_top_p if self.top_p is None else self.top_p)

    @field_validator("logprobs", check_fields=False)
    @classmethod
    def _no_logprobs(cls, value):
        """chat: a boolean; completions: an integer (0 asks for the chosen tokens' too): only none is served."""
        if value is not None and value is not False:
            raise ValueError(f"unsupported: logprobs={value}; this server returns no log probabilities (drop the "
                             "field)")
        return value

    @property
    def engine_seed(self) -> int | None:
        """The seed as a torch.Generator takes it: modulo 2**64 (OpenAI takes any integer)."""
        return None if self.seed is None else self.seed % 2**64

    @property
    def stop_strings(self) -> tuple[str, ...]:
        """The non-empty stop strings (an empty one stops nothing)."""
        stop = [self.stop] if isinstance(self.stop, str) else (self.stop or [])
        return tuple(s for s in stop if s)

    @property
    def include_usage_chunk(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class TextPart(BaseModel):
    """A content part; only text parts (images, audio, files are refused: the pair reads text)."""

    model_config = _STRICT
    type: Literal["text"]
    text: Text

    @model_validator(mode="before")
    @classmethod
    def _text_only(cls, part):
        if isinstance(part, dict) and part.get("type") not in (None, "text"):
            raise ValueError(f"only text content parts are supported, got {part.get('type')!r}")
        return part


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)  # name, tool_call_id, ... pass through to the template
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Text | list[TextPart] | None = None

    def text(self) -> str:
        """The message's text (its text parts joined)."""
        if self.content is None or isinstance(self.content, str):
            return self.content or ""
        return "".join(part.text for part in self.content)


class ResponseFormat(BaseModel):
    """OpenAI's ``response_format``: only its default, plain text, is served (no constrained decoding)."""

    model_config = _STRICT
    type: Literal["text", "json_object", "json_schema"] = Field(json_schema_extra={"enum": ["text"]})
    json_schema: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _text_only(self):
        if self.type != "text":
            raise ValueError(f"unsupported: response_format type {self.type!r}; this server does not constrain "
                             'decoding to JSON: drop response_format or send {"type": "text"}')
        return self


class ChatCompletionRequest(_Common):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: Budget | None = None
    tools: list[Any] | None = Field(default=None, max_length=0)
    tool_choice: str | None = Field(default=None, **_only("none"))
    response_format: ResponseFormat | None = None
    logprobs: bool | None = Field(default=None, **_only(False))
    top_logprobs: Int | None = Field(default=None, **_only(0))

    @model_validator(mode="after")
    def _refuse_chat_unsupported(self):
        for name in ("tools", "tool_choice", "top_logprobs"):
            if getattr(self, name) not in (None, [], "none", 0):
                raise ValueError(f"unsupported: {name}; {_UNSUPPORTED_HINT}")
        return self

    @property
    def budget_field(self) -> str:
        return "max_completion_tokens" if self.max_completion_tokens is not None else "max_tokens"

    def token_budget(self) -> int | None:
        return getattr(self, self.budget_field)

    def template_messages(self) -> list[dict[str, Any]]:
        return [{**m.model_dump(exclude_none=True, exclude={"content"}), "content": m.text()} for m in self.messages]


class CompletionRequest(_Common):
    prompt: Text | _Ids | Annotated[list[Text], Field(min_length=1, max_length=1)] | \
        Annotated[list[_Ids], Field(min_length=1, max_length=1)] = Field(description=(
        "one prompt: a string (tokenized as is; an empty one starts from the BOS token) or token ids; a list of "
        "one of these is taken too"))
    echo: bool = Field(default=False, json_schema_extra={"enum": [False]})
    suffix: str | None = Field(default=None, json_schema_extra={"maxLength": 0})
    best_of: Int | None = Field(default=None, **_only(1))
    logprobs: Annotated[int, Field(ge=0, le=5), BeforeValidator(_json_integer)] | None = Field(
        default=None, description="as OpenAI: an integer (top log probabilities a token); only null is served",
        **_only())

    @field_validator("prompt", mode="before")
    @classmethod
    def _one_prompt(cls, prompt):
        if isinstance(prompt, list) and len(prompt) > 1 and isinstance(prompt[0], (str, list)):
            raise ValueError(f"send one prompt per request (got a list of {len(prompt)}); the server batches "
                             "concurrent requests itself")
        return prompt

    @field_validator("prompt")
    @classmethod
    def _unwrap(cls, prompt):
        return prompt[0] if isinstance(prompt, list) and isinstance(prompt[0], (str, list)) else prompt

    @model_validator(mode="after")
    def _refuse_completion_unsupported(self):
        if self.echo or self.suffix or self.best_of not in (None, 1):
            raise ValueError(f"unsupported: echo / suffix / best_of; {_UNSUPPORTED_HINT}")
        return self

    budget_field: ClassVar[str] = "max_tokens"

    def token_budget(self) -> int | None:
        return self.max_tokens
