"""Latency estimator of the R-Stitch paper (Eq. 4), fitted per model and summed over a trace.

One forward call of a model that processes ``N_inf`` new tokens on a cache holding ``N_kv``
tokens is modelled as (milliseconds)::

    T(N_inf, N_kv) = a * N_inf * N_kv + b * N_inf**2 + c * N_inf + d            (Eq. 4)

The paper's Eq. 5 writes the decode step (N_inf = 1) as ``c * N_kv + d``; substituting
N_inf = 1 into Eq. 4 actually gives ``a * N_kv + (b + c + d)``. This module uses Eq. 4 for
every call, decode included. A separate two-parameter decode fit (slope and intercept over
N_inf = 1 points only) is kept as a reference and can be used for decode calls on request.

This module is pure arithmetic: it imports neither torch nor transformers, so the router's
reward and users choosing a threshold can use a profile without a GPU. It does not time
anything: :mod:`hf_rstitch.latency.profiler` measures, this module fits and predicts.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

FORMAT = "hf_rstitch.latency/1"
ROLES = ("slm", "llm")


class LatencyProfileError(ValueError):
    """A profile, a grid or a trace that the latency model cannot use."""


# ---- coefficients and fitting ------------------------------------------------------------------
@dataclass(frozen=True)
class Coefficients:
    """(a, b, c, d) of Eq. 4, in milliseconds; ``r2`` and ``n_points`` describe the fit."""

    a: float  # ms per (new token x cached token): attention over the cache
    b: float  # ms per new token squared: attention among the new tokens
    c: float  # ms per new token: weights, MLP, LM head
    d: float  # ms per call: launch overhead, weight reads of a memory-bound step
    r2: float | None = None
    n_points: int | None = None

    def __call__(self, n_inf: float, n_kv: float) -> float:
        return self.a * n_inf * n_kv + self.b * n_inf * n_inf + self.c * n_inf + self.d

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], where: str = "coefficients") -> "Coefficients":
        missing = [k for k in "abcd" if k not in d]
        if missing:
            raise LatencyProfileError(f"{where}: missing coefficient(s) {missing}; expected keys a, b, c, d (ms).")
        try:
            vals = {k: float(d[k]) for k in "abcd"}
        except (TypeError, ValueError):
            raise LatencyProfileError(f"{where}: coefficients must be numbers, got {dict(d)!r}.") from None
        r2 = d.get("r2")
        n = d.get("n_points")
        return cls(**vals, r2=None if r2 is None else float(r2), n_points=None if n is None else int(n))


def _as_points(points: Iterable[Sequence[float]]) -> np.ndarray:
    """Validate ``(n_inf, n_kv, ms)`` triples; returns an [N, 3] float64 array."""
    try:
        arr = np.asarray([tuple(p)[:3] for p in points], dtype=np.float64)
    except (TypeError, ValueError) as err:
        raise LatencyProfileError(f"points must be (n_inf, n_kv, milliseconds) triples: {err}") from None
    if arr.size == 0:
        raise LatencyProfileError("empty grid: fit() needs timed points (n_inf, n_kv, milliseconds); got none.")
    if arr.ndim != 2 or arr.shape[1] != 3:
        raise LatencyProfileError(f"points must be (n_inf, n_kv, milliseconds) triples; got shape {arr.shape}.")
    if not np.isfinite(arr).all():
        raise LatencyProfileError("points contain NaN or infinity; re-run the profiler for those grid cells.")
    if (arr[:, 0] < 1).any() or (arr[:, 1] < 0).any() or (arr[:, 2] < 0).any():
        raise LatencyProfileError("points need n_inf >= 1, n_kv >= 0 and milliseconds >= 0.")
    return arr


def _design(n_inf: np.ndarray, n_kv: np.ndarray) -> np.ndarray:
    # columns of Eq. 4: [N_inf*N_kv, N_inf^2, N_inf, 1]
    return np.stack([n_inf * n_kv, n_inf * n_inf, n_inf, np.ones_like(n_inf)], axis=1)


def grid_is_fittable(n_inf_values: Iterable[int], n_kv_values: Iterable[int]) -> bool:
    """Whether the full grid ``n_inf_values x n_kv_values`` determines all four coefficients."""
    pairs = [(float(i), float(k)) for i in set(n_inf_values) for k in set(n_kv_values)]
    if len(pairs) < 4:
        return False
    x = np.asarray(pairs)
    return _rank(_design(x[:, 0], x[:, 1])) == 4


def _rank(design: np.ndarray) -> int:
    scale = np.linalg.norm(design, axis=0)
    scale[scale == 0] = 1.0
    return int(np.linalg.matrix_rank(design / scale))


def _r2(y: np.ndarray, pred: np.ndarray) -> float:
    ss_res = float(((y - pred) ** 2).sum())
    ss_tot = float(((y - y.mean()) ** 2).sum())
    return 1.0 - ss_res / ss_tot if ss_tot > 0 else (1.0 if ss_res == 0 else 0.0)


def fit(points: Iterable[Sequence[float]], relative: bool = False) -> Coefficients:
    """Least-squares fit of Eq. 4 to timed calls.

    Args:
        points: ``(n_inf, n_kv, milliseconds)`` triples, one per grid cell (e.g. its median).
        relative: weight each residual by ``1 / milliseconds`` (minimises relative error), so
            cheap decode steps count as much as long prefills. The paper fits plain least squares.

    Returns:
        :class:`Coefficients` with R^2 computed on the unweighted milliseconds.
    """
    arr = _as_points(points)
    x = _design(arr[:, 0], arr[:, 1])
    y = arr[:, 2]
    distinct = len({(i, k) for i, k in arr[:, :2].tolist()})
    if distinct < 4 or _rank(x) < 4:
        raise LatencyProfileError(
            f"too few distinct points to fit Eq. 4: got {distinct} distinct (n_inf, n_kv) cell(s) and design rank "
            f"{_rank(x)}/4. Use at least 3 distinct N_inf values (one > 1) and 2 distinct N_kv values."
        )
    w = 1.0 / np.maximum(y, 1e-9) if relative else np.ones_like(y)
    scale = np.linalg.norm(x * w[:, None], axis=0)  # column scaling: N_inf*N_kv reaches ~1e7
    theta, *_ = np.linalg.lstsq(x * w[:, None] / scale, y * w, rcond=None)
    theta = theta / scale
    return Coefficients(*map(float, theta), r2=_r2(y, x @ theta), n_points=int(len(y)))


def fit_decode(points: Iterable[Sequence[float]]) -> Coefficients:
    """Two-parameter fit over the N_inf = 1 points only: ``T = slope * N_kv + intercept``.

    Returned as Eq. 4 coefficients with ``b = c = 0`` (``a`` = slope, ``d`` = intercept), so
    it predicts exactly like the full model at N_inf = 1. Other points are ignored.
    """
    arr = _as_points(points)
    arr = arr[arr[:, 0] == 1]
    if len(np.unique(arr[:, 1])) < 2:
        raise LatencyProfileError(
            "too few distinct points for the decode fit: need N_inf = 1 timed at >= 2 distinct N_kv values."
        )
    x = np.stack([arr[:, 1], np.ones(len(arr))], axis=1)
    (slope, intercept), *_ = np.linalg.lstsq(x, arr[:, 2], rcond=None)
    return Coefficients(float(slope), 0.0, 0.0, float(intercept), r2=_r2(arr[:, 2], x @ [slope, intercept]),
                        n_points=int(len(arr)))


# ---- one model's profile -----------------------------------------------------------------------
@dataclass
class ModelProfile:
    """What the profiler writes for one model: its fits, the model's facts and the raw grid."""

    fit: Coefficients
    decode_fit: Coefficients | None = None
    model: dict[str, Any] = field(default_factory=dict)  # name, hidden_size, num_hidden_layers, vocab_size, ...
    grid: list[dict[str, Any]] = field(default_factory=list)  # {"n_inf", "n_kv", "median_ms", "samples_ms"}
    meta: dict[str, Any] = field(default_factory=dict)  # device, dtype, versions, date, settings

    def predict(self, n_inf: int, n_kv: int, decode_fit: bool = False) -> float:
        if n_inf < 1 or n_kv < 0:
            raise LatencyProfileError(f"a forward call needs n_inf >= 1 and n_kv >= 0; got n_inf={n_inf}, n_kv={n_kv}.")
        if decode_fit and n_inf == 1 and self.decode_fit is not None:
            return self.decode_fit(1, n_kv)
        return self.fit(n_inf, n_kv)

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "unit": "ms",
            "equation": "T(N_inf, N_kv) = a*N_inf*N_kv + b*N_inf^2 + c*N_inf + d",
            "model": dict(self.model),
            "fit": self.fit.to_dict(),
            "decode_fit": None if self.decode_fit is None else self.decode_fit.to_dict(),
            **{k: v for k, v in self.meta.items() if k not in ("model", "fit", "decode_fit", "grid")},
            "grid": list(self.grid),
        }

    @classmethod
    def from_dict(cls, d: Any, where: str = "profile") -> "ModelProfile":
        if not isinstance(d, Mapping):
            raise LatencyProfileError(f"{where}: expected a JSON object, got {type(d).__name__}.")
        if d.get("format", FORMAT) != FORMAT:
            raise LatencyProfileError(f"{where}: unknown format {d.get('format')!r}; expected {FORMAT!r}.")
        if "fit" not in d:
            raise LatencyProfileError(f"{where}: no 'fit' entry; write profiles with `rstitch profile`.")
        unit = d.get("unit", "ms")
        if unit != "ms":
            raise LatencyProfileError(f"{where}: coefficients must be in milliseconds ('unit': 'ms'), got {unit!r}.")
        dec = d.get("decode_fit")
        meta = {k: v for k, v in d.items() if k not in ("format", "unit", "equation", "model", "fit", "decode_fit",
                                                          "grid")}
        return cls(
            fit=Coefficients.from_dict(d["fit"], f"{where}.fit"),
            decode_fit=None if dec is None else Coefficients.from_dict(dec, f"{where}.decode_fit"),
            model=dict(d.get("model") or {}),
            grid=list(d.get("grid") or []),
            meta=meta,
        )

    def check_model(self, config: Any, check_name: bool = True, where: str = "profile") -> None:
        """Raise if this profile was measured on a different model than ``config`` describes.

        ``config`` is a transformers config (or anything with ``hidden_size``, ``vocab_size``,
        ``num_hidden_layers`` and optionally ``_name_or_path``), or a dict of those. Facts that
        either side lacks are not compared. ``check_name=False`` skips the name, e.g. to apply a
        random-weight profile of the same shape to a real checkpoint.
        """
        get = config.get if isinstance(config, Mapping) else (lambda k, default=None: getattr(config, k, default))
        theirs = {k: get(k) for k in ("hidden_size", "num_hidden_layers", "vocab_size")}
        theirs["name"] = get("name") or get("_name_or_path") or get("name_or_path")
        keys = ["hidden_size", "num_hidden_layers", "vocab_size"] + (["name"] if check_name else [])
        bad = [f"{k}: profile {self.model[k]!r} vs model {theirs[k]!r}" for k in keys
               if self.model.get(k) not in (None, "") and theirs.get(k) not in (None, "")
               and self.model[k] != theirs[k]]
        if bad:
            raise LatencyProfileError(
                f"{where} does not match the model it is applied to ({'; '.join(bad)}). Profile this model with "
                f"`rstitch profile --model ...`" + (", or pass check_name=False if only the name differs." if check_name
                                                    else ".")
            )


# ---- the two-model estimator -------------------------------------------------------------------
def _role_name(role: Any) -> str:
    value = getattr(role, "value", role)  # Role enum or its string value; no torch import needed
    if value not in ROLES:
        raise LatencyProfileError(f"unknown role {role!r}; expected one of {ROLES}.")
    return value


def _load_json(source: str | Path | Mapping[str, Any]) -> tuple[Any, str]:
    if not isinstance(source, (str, Path)):
        return source, "profile"  # an already-parsed document; ModelProfile.from_dict checks it
    path = Path(source)
    try:
        text = path.read_text()
    except OSError as err:
        raise LatencyProfileError(f"cannot read latency profile {path}: {err}") from None
    try:
        return json.loads(text), str(path)
    except json.JSONDecodeError as err:
        raise LatencyProfileError(
            f"{path} is not valid JSON ({err.msg} at line {err.lineno}, column {err.colno}); "
            "re-create it with `rstitch profile`."
        ) from None


class LatencyModel:
    """Per-role profiles (``"slm"``, ``"llm"``) and trajectory prediction in milliseconds.

    Example::

        lm = LatencyModel.from_profiles(slm="latency_qwen2_1.5b.json", llm="latency_qwen2_7b.json")
        lm.predict_call(1, 4096, role="llm")      # one decode step
        lm.predict_trace(out.stitch)              # a whole stitched generation
    """

    def __init__(self, profiles: Mapping[Any, ModelProfile], decode_fit: bool = False, step_ms: float = 0.0):
        if not profiles:
            raise LatencyProfileError("LatencyModel needs at least one role's profile ('slm' and/or 'llm').")
        if not (math.isfinite(step_ms) and step_ms >= 0):
            raise LatencyProfileError(f"step_ms must be a finite number >= 0 (ms per new token), got {step_ms!r}.")
        self.profiles = {_role_name(r): p for r, p in profiles.items()}
        self.decode_fit = decode_fit  # use the N_inf = 1 reference fit for decode steps
        # host cost of the decode loop per new token (sampling, routing, bookkeeping) outside the
        # forward calls; 0 is the paper's model (forward calls only). See calibrate_step_ms.
        self.step_ms = float(step_ms)

    # -- construction / IO --
    @classmethod
    def from_profiles(cls, slm: Any = None, llm: Any = None, decode_fit: bool = False) -> "LatencyModel":
        """Build from per-model profiles: paths, dicts or :class:`ModelProfile` objects."""
        profiles = {}
        for role, src in (("slm", slm), ("llm", llm)):
            if src is None:
                continue
            if isinstance(src, ModelProfile):
                profiles[role] = src
            else:
                data, where = _load_json(src)
                profiles[role] = ModelProfile.from_dict(data, where)
        return cls(profiles, decode_fit=decode_fit)

    def to_dict(self) -> dict[str, Any]:
        return {"format": FORMAT, "unit": "ms", "decode_fit": self.decode_fit, "step_ms": self.step_ms,
                "roles": {r: p.to_dict() for r, p in self.profiles.items()}}

    @classmethod
    def from_dict(cls, d: Any, where: str = "latency model") -> "LatencyModel":
        if not isinstance(d, Mapping) or not isinstance(d.get("roles"), Mapping):
            raise LatencyProfileError(
                f"{where}: expected {{'roles': {{'slm': profile, 'llm': profile}}}}; for a single model's profile "
                "use LatencyModel.from_profiles(slm=..., llm=...)."
            )
        return cls({r: ModelProfile.from_dict(p, f"{where}.roles.{r}") for r, p in d["roles"].items()},
                   decode_fit=bool(d.get("decode_fit", False)), step_ms=float(d.get("step_ms", 0.0)))

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=1) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> "LatencyModel":
        data, where = _load_json(path)
        return cls.from_dict(data, where)

    # -- checks --
    def profile(self, role: Any) -> ModelProfile:
        name = _role_name(role)
        if name not in self.profiles:
            raise LatencyProfileError(
                f"no latency profile for role {name!r} (have {sorted(self.profiles)}); "
                f"load one with LatencyModel.from_profiles({name}='latency_....json')."
            )
        return self.profiles[name]

    def check_models(self, slm: Any = None, llm: Any = None, check_name: bool = True) -> None:
        """Raise :class:`LatencyProfileError` if a profile does not match the given config(s)."""
        for role, cfg in (("slm", slm), ("llm", llm)):
            if cfg is not None:
                self.profile(role).check_model(getattr(cfg, "config", cfg), check_name, where=f"{role} profile")

    # -- prediction --
    def predict_call(self, n_inf: int, n_kv: int, role: Any = None) -> float:
        """Milliseconds of one forward call (Eq. 4). ``role`` may be omitted with a single profile."""
        if role is None:
            if len(self.profiles) != 1:
                raise LatencyProfileError("predict_call needs role='slm' or 'llm' when both profiles are loaded.")
            role = next(iter(self.profiles))
        return self.profile(role).predict(int(n_inf), int(n_kv), self.decode_fit)

    def predict_calls(self, trace: Any) -> list[float]:
        """Milliseconds of every forward call in ``trace`` (see :meth:`predict_trace`)."""
        return [self.predict_call(n_inf, n_kv, role) for role, n_inf, n_kv in _iter_calls(trace)]

    def predict_trace(self, trace: Any) -> float:
        """Estimated latency (ms) of a stitched generation: the sum over all forward calls (Eq. 4),
        plus ``step_ms`` per new token when the trace says how many there were.

        ``trace`` is a :class:`~hf_rstitch.core.trace.StitchTrace`, its ``to_dict()``, or a list of
        ``(role, n_inf, n_kv)`` tuples / ``ForwardCall`` objects / call dicts.
        """
        return float(math.fsum(self.predict_calls(trace))) + self.step_ms * _n_tokens(trace)

    def __repr__(self) -> str:
        parts = [f"{r}: a={p.fit.a:.3g} b={p.fit.b:.3g} c={p.fit.c:.3g} d={p.fit.d:.3g}" for r, p in
                 self.profiles.items()]
        return f"LatencyModel({'; '.join(parts)} [ms])"


def _n_tokens(trace: Any) -> int:
    """New tokens of a trace (0 for a bare list of calls)."""
    roles = trace.get("roles") if isinstance(trace, Mapping) else getattr(trace, "roles", None)
    return len(roles) if roles is not None else 0


def calibrate_step_ms(forward_ms: Sequence[float], wall_ms: Sequence[float], n_tokens: Sequence[int]) -> float:
    """Per-token loop overhead (ms) that best explains ``wall - forward`` by least squares
    through the origin: ``step = sum(r * n) / sum(n^2)``, clamped at 0.

    Args:
        forward_ms: predicted (or measured) forward time of each generation.
        wall_ms: measured wall time of each generation.
        n_tokens: new tokens of each generation.
    """
    if not (len(forward_ms) == len(wall_ms) == len(n_tokens)) or not n_tokens:
        raise LatencyProfileError("calibrate_step_ms needs equally long, non-empty lists of forward_ms, wall_ms, n_tokens.")
    num = math.fsum((w - f) * n for f, w, n in zip(forward_ms, wall_ms, n_tokens))
    den = math.fsum(n * n for n in n_tokens)
    if den == 0:
        raise LatencyProfileError("calibrate_step_ms needs at least one generation with new tokens.")
    return max(0.0, num / den)


def _iter_calls(trace: Any) -> Iterable[tuple[str, int, int]]:
    calls = trace.get("calls") if isinstance(trace, Mapping) else getattr(trace, "calls", trace)
    if calls is None or isinstance(calls, (str, bytes)):
        raise LatencyProfileError("trace has no 'calls'; pass a StitchTrace, its to_dict(), or (role, n_inf, n_kv) tuples.")
    for i, c in enumerate(calls):
        try:
            if isinstance(c, Mapping):
                yield _role_name(c["role"]), int(c["n_inf"]), int(c["n_kv"])
            elif hasattr(c, "n_inf"):
                yield _role_name(c.role), int(c.n_inf), int(c.n_kv)
            else:
                role, n_inf, n_kv = c
                yield _role_name(role), int(n_inf), int(n_kv)
        except (KeyError, TypeError, ValueError) as err:
            if isinstance(err, LatencyProfileError):
                raise
            raise LatencyProfileError(
                f"trace call {i} ({c!r}) is not (role, n_inf, n_kv): {err!r}"
            ) from None
