"""Latency profiler and estimator (R-Stitch paper, Eq. 4).

``LatencyModel`` and the fitting functions are torch-free; the profiler (which times a model)
is imported lazily: ``from hf_rstitch.latency.profiler import profile_model``.
"""

from .model import (
    Coefficients,
    LatencyModel,
    LatencyProfileError,
    ModelProfile,
    calibrate_step_ms,
    fit,
    fit_decode,
    grid_is_fittable,
)

__all__ = ["Coefficients", "LatencyModel", "LatencyProfileError", "ModelProfile", "calibrate_step_ms", "fit",
           "fit_decode", "grid_is_fittable"]
