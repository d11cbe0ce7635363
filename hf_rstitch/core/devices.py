"""Where a model lives: the devices holding its parameters, whether it is split over several (accelerate's
``device_map``, tensor parallelism) and a one-line description for logs. Facts only: what stitched decoding
refuses is :mod:`hf_rstitch.hf.placement`'s, what the fast engine refuses :mod:`hf_rstitch.fast.support`'s.
"""

from __future__ import annotations

import torch


def tp_mesh(model: torch.nn.Module):
    """The tensor-parallel ``DeviceMesh`` the model is sharded over, or None.

    transformers records it on the model (``_device_mesh``, ``_tp_size``); a model sharded by
    hand with ``torch.distributed.tensor.parallelize_module`` is recognised by its DTensor
    parameters.
    """
    mesh = getattr(model, "_device_mesh", None)
    if mesh is not None and (getattr(model, "_tp_size", None) or 1) > 1:
        names = mesh.mesh_dim_names or ()
        return mesh["tp"] if mesh.ndim > 1 and "tp" in names else mesh
    for param in model.parameters():
        mesh = getattr(param, "device_mesh", None)  # DTensor
        if mesh is not None and mesh.size() > 1:
            return mesh
    return None


def devices(model: torch.nn.Module) -> set[torch.device]:
    """Devices holding the model's parameters (``meta`` for ones accelerate offloaded)."""
    return {p.device for p in model.parameters()}


def is_sharded(model: torch.nn.Module) -> bool:
    """Split over several devices (device_map) or ranks (tensor parallelism)."""
    dispatched = {str(d) for d in (getattr(model, "hf_device_map", None) or {}).values()}
    return tp_mesh(model) is not None or len(dispatched) > 1 or len(devices(model) - {torch.device("meta")}) > 1


def describe(model: torch.nn.Module) -> str:
    """One line for logs and benchmark tables, e.g. ``tensor-parallel x2 (this rank: cuda:1)``."""
    mesh = tp_mesh(model)
    if mesh is not None:
        return f"tensor-parallel x{mesh.size()} (this rank: {model.device})"
    dmap = getattr(model, "hf_device_map", None) or {}
    if len({str(d) for d in dmap.values()}) > 1:
        counts: dict[str, int] = {}
        for d in dmap.values():
            counts[str(d)] = counts.get(str(d), 0) + 1
        return "device_map " + ", ".join(f"{d}: {n} modules" for d, n in counts.items())
    return str(model.device)
