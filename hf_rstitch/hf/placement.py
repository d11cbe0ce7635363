"""Where the two models live, and the layouts stitched decoding refuses.

Stitched decoding runs unchanged on the distributed machinery transformers already uses:

* **accelerate ``device_map``** (``from_pretrained(device_map="auto")`` or ``dispatch_model``): one
  process, the LLM's layers spread over devices. accelerate's hooks move activations between
  layers; a lane feeds token ids to ``model.device`` (the input embeddings' device) and gets the
  logits back there; each layer's ``DynamicCache`` entry is created on that layer's device.
* **tensor parallelism** (``DistributedConfig(tp_plan="auto")`` under ``torchrun``): every rank
  runs the same loop on the same prompt with its own whole SLM on its local device. The LLM's
  logits are all-gathered, so they -- and every entropy and routing decision made from them --
  are identical on all ranks; sampling needs the same seed on every rank.

This module only inspects placements and refuses what cannot work, saying how to fix it. It
does not move models and holds no decoding logic.
"""

from __future__ import annotations

import torch
from transformers import PreTrainedModel

from ..core.devices import describe, devices, is_sharded, tp_mesh  # noqa: F401  (describe, is_sharded: read from here too)
from ..core.roles import Role
from ..engine.engine import refuse_sharded

_OFFLOAD = ("cpu", "disk")


def check_placement(
    llm: PreTrainedModel,
    slm: PreTrainedModel,
    input_ids: torch.Tensor,
    do_sample: bool = False,
    engine: object = "default",
) -> None:
    """Refuse layouts stitched decoding cannot run; each error names the problem and the fix.

    Args:
        llm / slm: the pair as passed to ``generate``.
        input_ids: ``[B, T]`` the prompt; under tensor parallelism it must be the same on all ranks.
        do_sample: sampling is requested; under tensor parallelism every rank's RNG must agree.
        engine: the ``stitch_engine`` argument: a fast engine named runs single-device models only
            (:func:`hf_rstitch.engine.engine.refuse_sharded`; ``"auto"`` runs sharded models on the eager lanes).

    Under tensor parallelism this makes one small collective (a fingerprint of the prompt and the
    sampling RNG, all-reduced over the LLM's mesh), so every rank must call ``generate``.
    """
    for model, role in ((llm, Role.LLM), (slm, Role.SLM)):
        _check_loaded(model, role)
        _check_parallelism_kind(model, role)
    refuse_sharded(llm, slm, engine)
    mesh = tp_mesh(llm)
    if mesh is None:
        slm_mesh = tp_mesh(slm)
        if slm_mesh is not None:
            _check_same_on_ranks(input_ids, do_sample, slm_mesh, slm.device)
        return
    _check_slm_beside_tp_llm(llm, slm, mesh)
    _check_same_on_ranks(input_ids, do_sample, mesh, llm.device)


def _check_loaded(model: PreTrainedModel, role: Role) -> None:
    """Token ids go to ``model.device``: it must be a real device, not an offloaded 'meta' one."""
    if model.device.type != "meta":
        return
    first = next(name for name, p in model.named_parameters() if p.device.type == "meta")
    dmap = getattr(model, "hf_device_map", None)
    if dmap:
        placed = {k: v for k, v in dmap.items() if first.startswith(k + ".") or k == "" or first == k}
        raise ValueError(
            f"the {role}'s first parameter `{first}` is offloaded by its device_map ({placed or dmap}): its weights "
            "sit on 'meta' and stitched decoding sends token ids to model.device, the input embeddings' device. Put "
            "the input embeddings on a GPU (e.g. device_map={'model.embed_tokens': 0, ...}, or device_map='auto', "
            "which places the first modules first) and offload only later layers."
        )
    raise ValueError(
        f"the {role}'s weights are on the 'meta' device (`{first}`): the model was built without loading them "
        "(e.g. under init_empty_weights). Load it with from_pretrained, or dispatch it with "
        "accelerate.load_checkpoint_and_dispatch, before generating."
    )


def _check_parallelism_kind(model: PreTrainedModel, role: Role) -> None:
    """FSDP and pipeline parallelism need every rank to run the same forwards on different data."""
    cfg = getattr(model.config, "distributed_config", None)
    kinds = []
    if cfg is not None and (getattr(cfg, "fsdp_size", 1) or 1) > 1:
        kinds.append(f"FSDP (fsdp_size={cfg.fsdp_size})")
    if cfg is not None and (getattr(cfg, "pp_size", 1) or 1) > 1:
        kinds.append(f"pipeline parallelism (pp_size={cfg.pp_size})")
    try:
        from torch.distributed.fsdp import FSDPModule

        if isinstance(model, FSDPModule) and not kinds:
            kinds.append("FSDP (fully_shard)")
    except ImportError:  # pragma: no cover - torch without FSDP2
        pass
    if kinds:
        raise ValueError(
            f"the {role} runs under {' and '.join(kinds)}, which stitched decoding does not support: each rank "
            "routes its own rows, so ranks would run different numbers of forward calls and the collectives would "
            "hang. Load it with DistributedConfig(tp_plan='auto') (tensor parallelism, same prompt on every rank) "
            "or with device_map='auto' in one process."
        )


def _check_slm_beside_tp_llm(llm: PreTrainedModel, slm: PreTrainedModel, mesh) -> None:
    local = llm.device
    slm_mesh = tp_mesh(slm)
    if slm_mesh is not None:
        if slm_mesh.device_type != mesh.device_type or not torch.equal(slm_mesh.mesh.cpu(), mesh.mesh.cpu()):
            raise ValueError(
                f"the SLM is tensor-parallel over ranks {slm_mesh.mesh.tolist()} ({slm_mesh.device_type}) but the "
                f"LLM over ranks {mesh.mesh.tolist()} ({mesh.device_type}); both run on every step of every rank, "
                "so a sharded SLM must use the LLM's mesh. Load the SLM without a tp_plan (it is small: one whole "
                "copy per rank), or with the same DistributedConfig as the LLM."
            )
        return
    where = devices(slm)
    if where != {local}:
        found = ", ".join(sorted(str(d) for d in where))
        raise ValueError(
            f"under tensor parallelism every rank runs the stitched loop with its own whole SLM on its local device "
            f"{local} (where this rank's LLM shard is), but the SLM is on {found}. Put it there on every rank: "
            "AutoModelForCausalLM.from_pretrained(slm_id, device_map={'': int(os.environ['LOCAL_RANK'])}) or "
            "slm.to(llm.device); do not offload or split it."
        )


def _fingerprint(input_ids: torch.Tensor, do_sample: bool, device: torch.device) -> torch.Tensor:
    """``[4]`` int64: batch, length, a checksum of the ids, and one of the sampling RNG state."""
    ids = input_ids.detach().to(device=device, dtype=torch.long).flatten()
    weights = torch.arange(1, ids.numel() + 1, device=device, dtype=torch.long)
    rng = torch.zeros((), dtype=torch.long, device=device)
    if do_sample:  # sampling draws from the generator of the sequence's device (core.sampling.pick_tokens)
        state = torch.cuda.get_rng_state(input_ids.device) if input_ids.device.type == "cuda" else torch.get_rng_state()
        state = state.to(device=device, dtype=torch.long)
        rng = (state * torch.arange(1, state.numel() + 1, device=device, dtype=torch.long)).sum()
    shape = torch.tensor(list(input_ids.shape), dtype=torch.long, device=device)
    return torch.cat([shape, (ids * weights).sum()[None], rng[None]])


def _check_same_on_ranks(input_ids: torch.Tensor, do_sample: bool, mesh, device: torch.device) -> None:
    """All ranks of a tensor-parallel model must decode the same prompt with the same RNG."""
    import torch.distributed as dist

    mine = _fingerprint(input_ids, do_sample, device)
    both = torch.cat([mine, -mine])
    dist.all_reduce(both, op=dist.ReduceOp.MAX, group=mesh.get_group())
    high, low = both[:4].tolist(), (-both[4:]).tolist()
    if high[:3] != low[:3]:
        raise ValueError(
            f"tensor-parallel ranks were given different prompts (input_ids shapes or ids differ across the "
            f"{mesh.size()} ranks; this rank: {tuple(input_ids.shape)}). Every rank computes a slice of the same "
            "forward pass, so every rank must call generate with the same input_ids and attention_mask: tokenize "
            "the same text on all ranks (or broadcast the ids from rank 0)."
        )
    if high[3] != low[3]:
        raise ValueError(
            "do_sample=True under tensor parallelism with different random states on the ranks: each rank samples "
            "its own copy of the next token, so ranks would diverge and the collectives would hang. Seed every rank "
            "the same way before generate, e.g. torch.manual_seed(0) (or transformers.set_seed(0)) on all ranks."
        )
