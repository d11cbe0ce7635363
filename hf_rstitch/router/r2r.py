"""R2R's neural token router (Fu et al., "R2R: Efficiently Navigating Divergent Reasoning Paths with
Small-Large Model Token Routing", NeurIPS 2025; github.com/thu-nics/R2R), loaded from its published files.

R2R asks a small MLP after *every* SLM token whether the token may diverge from the LLM's reasoning; if
so, the LLM writes that position, and after that one token the SLM resumes. The router reads three
things of the SLM at the position: its last hidden state (after the final norm, the LM head's input),
its top-k logits (k = ``logits_size``, sorted, raw) and the embedding of its token. Its published
routers (``HiddenStatesTokenLMHeadLogitsClassifier``) compute::

    h, e, z = hidden [B, H], embed(token) [B, E], topk(logits) [B, k]
    (optionally LayerNorm(h), LayerNorm(e), softmax(z))
    x = W_s W_in [h ; e ; W_z z]                  -> [B, d_0]   (W_in: combined projection, W_s: backbone stem)
    x = x + ... per block: skip(x) + W_2 GELU(W_1 LN(x))   (d_i -> d_{i+1}, the last block keeps its width)
    p = sigmoid(w . LN(x) + b)                    -> LLM when p >= threshold

This module is our own forward of that computation with our own module layout; :func:`load_r2r`
maps R2R's checkpoint keys onto it. The token embedding table is the SLM's input embedding: R2R's
published files leave it out (``pretrained_model_name`` names the SLM it was copied from), so it is
taken from the SLM it runs with, and checked against the router's sizes.

Checkpoint formats recognised (:func:`find_checkpoint`): a ``.pt`` file as R2R's ``save_model`` writes
it (``model_type``, ``init_args``, ``common_args`` with ``threshold`` / ``input_type``, ``state_dict``);
a folder holding one (``default_router.pt``, ``router.pt``, ``default_router_sampling.pt`` or the only
``*.pt``), optionally with R2R's ``model_configs.json`` whose ``router`` entry names ``router_path`` and
``threshold``; a Hub repository of those, or a folder of one (``nics-efc/R2R_router_collections/
Qwen3-0.6B+Qwen3-8B``). Files are read with ``torch.load(weights_only=True)``: tensors and plain data only.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn

R2R_TYPE = "HiddenStatesTokenLMHeadLogitsClassifier"
PT_NAMES = ("default_router.pt", "router.pt", "default_router_sampling.pt")
CONFIG_NAME = "model_configs.json"


class _Block(nn.Module):
    """``skip(x) + W_2 GELU(W_1 LN(x))``, ``d_in -> d_out`` (skip: a projection where the widths differ)."""

    def __init__(self, d_in: int, d_out: int, expansion: int):
        super().__init__()
        self.norm = nn.LayerNorm(d_in)
        self.up = nn.Linear(d_in, d_in * expansion)
        self.down = nn.Linear(d_in * expansion, d_out)
        self.skip = nn.Linear(d_in, d_out) if d_in != d_out else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        skip = x if self.skip is None else self.skip(x)
        return skip + self.down(nn.functional.gelu(self.up(self.norm(x))))


class R2RRouter(nn.Module):
    """R2R's token router: ``(hidden [B, H], token [B], top logits [B, k]) -> P(diverges) [B]``.

    Args:
        hidden_size: the SLM's hidden size (``hidden_states_size``).
        embed: ``[V, E]`` the SLM's input embedding table (not copied; not a parameter of the router).
        logits_size: k, the top logits read.
        widths: the backbone's widths (``hidden_dims``).
        expansion: the blocks' inner width factor (``expansion_factor``).
        normalize_input: LayerNorm the hidden state and the embedding, softmax the top logits.
        threshold: P at or above which the LLM writes the position (``common_args.threshold``).
    """

    def __init__(self, hidden_size: int, embed: torch.Tensor, logits_size: int, widths: list[int],
                 expansion: int = 4, normalize_input: bool = False, threshold: float = 0.5):
        super().__init__()
        self.hidden_size, self.logits_size, self.threshold = int(hidden_size), int(logits_size), float(threshold)
        self.embed = embed
        self.normalize_input = bool(normalize_input)
        if self.normalize_input:
            self.hidden_norm, self.embed_norm = nn.LayerNorm(hidden_size), nn.LayerNorm(embed.shape[1])
        self.logits_in = nn.Linear(logits_size, hidden_size)
        self.input = nn.Linear(2 * hidden_size + embed.shape[1], widths[0])
        self.stem = nn.Linear(widths[0], widths[0])
        dims = list(widths) + [widths[-1]]
        self.blocks = nn.ModuleList(_Block(a, b, expansion) for a, b in zip(dims[:-1], dims[1:]))
        self.norm = nn.LayerNorm(widths[-1])
        self.head = nn.Linear(widths[-1], 1)

    def features(self, hidden: torch.Tensor, logits: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The router's inputs from an SLM forward: ``hidden [B, H]``, the token (argmax of ``logits
        [B, V]``) and the top-k logits, all float32 on the router's device."""
        device = self.head.weight.device
        logits = logits.to(device=device, dtype=torch.float32)
        top = torch.topk(logits, self.logits_size, dim=-1).values  # [B, k], sorted
        return hidden.to(device=device, dtype=torch.float32), logits.argmax(dim=-1), top

    def forward(self, hidden: torch.Tensor, token: torch.Tensor, top: torch.Tensor) -> torch.Tensor:
        """``[B]`` probability that the SLM's token diverges (the LLM should write it)."""
        e = nn.functional.embedding(token.to(self.embed.device), self.embed).to(hidden)
        if self.normalize_input:
            hidden, e, top = self.hidden_norm(hidden), self.embed_norm(e), torch.softmax(top, dim=-1)
        x = self.stem(self.input(torch.cat([hidden, e, self.logits_in(top)], dim=-1)))
        for block in self.blocks:
            x = block(x)
        return torch.sigmoid(self.head(self.norm(x))).squeeze(-1)

    def diverges(self, hidden: torch.Tensor, logits: torch.Tensor, threshold: float | None = None) -> torch.Tensor:
        """``[B]`` bool: the LLM writes this position (P >= threshold; default: the router's own)."""
        tau = self.threshold if threshold is None else threshold
        return self(*self.features(hidden, logits)) >= tau


def _key_map(n_blocks: int) -> dict[str, str]:
    """R2R's state-dict names -> ours (``backbone.blocks.i.mlp.0`` is our ``blocks.i.up``, ...)."""
    names = {"logits_projection": "logits_in", "combined_projection": "input", "backbone.input_projection": "stem",
             "backbone.output_layer.0": "norm",
             "backbone.output_layer.1": "head", "layer_norm_hidden_states": "hidden_norm", "layer_norm_token": "embed_norm"}
    for i in range(n_blocks):
        theirs, ours = f"backbone.blocks.{i}", f"blocks.{i}"
        names.update({f"{theirs}.layer_norm": f"{ours}.norm", f"{theirs}.mlp.0": f"{ours}.up",
                      f"{theirs}.mlp.3": f"{ours}.down", f"{theirs}.dim_change": f"{ours}.skip"})
    return names


def _ours(state: dict, n_blocks: int) -> dict:
    names = _key_map(n_blocks)
    out = {}
    for key, value in state.items():
        if key == "token_embeddings.weight":
            continue
        module, _, leaf = key.rpartition(".")
        if module not in names:
            raise ValueError(f"the R2R checkpoint has a weight {key!r} this loader does not know; expected the "
                             f"weights of {R2R_TYPE} (R2R's published routers).")
        out[f"{names[module]}.{leaf}"] = value
    return out


def _check_args(ckpt: dict, source) -> dict:
    kind = ckpt.get("model_type")
    if kind != R2R_TYPE:
        raise ValueError(f"{source} holds an R2R router of type {kind!r}; this loader runs {R2R_TYPE} (the type of "
                         "every router R2R publishes). Retrain with that model_type, or load another checkpoint.")
    args = ckpt.get("init_args", {})
    if args.get("use_position_embedding"):
        raise ValueError(f"{source} uses R2R's position embedding, which its published routers leave off and this "
                         "loader does not run; use a router trained with use_position_embedding=false.")
    inputs = (ckpt.get("common_args") or {}).get("input_type")
    if inputs is not None and sorted(inputs) != ["hidden_states", "logits", "token"]:
        raise ValueError(f"{source} reads {inputs}; {R2R_TYPE} reads hidden_states, token and logits.")
    return args


def router_from_checkpoint(ckpt: dict, embed: torch.Tensor, threshold: float | None = None,
                           source: str = "the checkpoint") -> R2RRouter:
    """An :class:`R2RRouter` from a loaded R2R checkpoint dict and the SLM's embedding table ``[V, E]``."""
    args = _check_args(ckpt, source)
    state = ckpt["state_dict"]
    if "token_embeddings.weight" in state and tuple(state["token_embeddings.weight"].shape) != tuple(embed.shape):
        raise ValueError(f"{source} was trained with token embeddings of shape {tuple(state['token_embeddings.weight'].shape)}, "
                         f"the SLM's are {tuple(embed.shape)}: the router belongs to another SLM "
                         f"({args.get('pretrained_model_name', 'unnamed')}).")
    if "token_embeddings.weight" in state:
        embed = state["token_embeddings.weight"]
    hidden = int(args.get("hidden_states_size", 1536))
    widths = list(args.get("hidden_dims", [256, 512, 256]))
    own = (ckpt.get("common_args") or {}).get("threshold")
    tau = threshold if threshold is not None else (own if own is not None else 0.5)
    router = R2RRouter(hidden, embed, int(args.get("logits_size", 100)), widths, int(args.get("expansion_factor", 4)),
                       bool(args.get("normalize_input", False)), float(tau))
    missing, unexpected = router.load_state_dict(_ours(state, len(widths)), strict=False)
    if missing or unexpected:
        raise ValueError(f"{source} does not fit {R2R_TYPE} with init_args {args}: missing {missing}, "
                         f"unexpected {unexpected}.")
    return router.float().eval()


def save_r2r(router: R2RRouter, path, pretrained_model_name: str = "", dropout_rate: float = 0.1) -> Path:
    """Write ``router`` as R2R's ``save_model`` does (the trained weights, no token embeddings), loadable by
    R2R's own ``load_model`` and by :func:`load_r2r`."""
    ours = {v: k for k, v in _key_map(len(router.blocks)).items()}
    state = {}
    for key, value in router.state_dict().items():
        module, _, leaf = key.rpartition(".")
        state[f"{ours[module]}.{leaf}"] = value.detach().cpu()
    widths = [router.input.out_features] + [b.down.out_features for b in router.blocks][:-1]
    ckpt = {"model_type": R2R_TYPE,
            "init_args": {"hidden_states_size": router.hidden_size, "logits_size": router.logits_size,
                          "hidden_dims": widths, "expansion_factor": router.blocks[0].up.out_features // widths[0],
                          "dropout_rate": dropout_rate, "pretrained_model_name": pretrained_model_name,
                          "use_position_embedding": False, "max_position_embeddings": 1024, "topk": None,
                          "normalize_input": router.normalize_input, "freeze_lm_head": True},
            "common_args": {"threshold": router.threshold, "input_type": ["hidden_states", "token", "logits"]},
            "model_specific_args": {}, "state_dict": state}
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(ckpt, path)
    return path


def find_checkpoint(source) -> tuple[Path, float | None] | None:
    """``(the .pt file, the folder config's threshold or None)`` if ``source`` is an R2R router on disk, else None."""
    path = Path(str(source))
    if path.is_file():
        return (path, None) if path.suffix == ".pt" else None
    if not path.is_dir() or (path / "model.safetensors").exists():
        return None
    threshold, named = None, None
    if (path / CONFIG_NAME).is_file():
        router = json.loads((path / CONFIG_NAME).read_text()).get("router", {})
        threshold, named = router.get("threshold"), router.get("router_path")
    candidates = [path / Path(named).name] if named else []
    candidates += [path / n for n in PT_NAMES] + sorted(path.glob("*.pt"))
    found = next((c for c in candidates if c.is_file()), None)
    return (found, None if threshold is None else float(threshold)) if found is not None else None


def hub_folder(source: str) -> Path | None:
    """A Hub id (``org/repo`` or ``org/repo/sub/folder``) downloaded when it holds R2R router files; None when
    it does not, or the Hub cannot be reached (then the caller tries its other formats)."""
    parts = source.strip("/").split("/")
    if len(parts) < 2 or Path(source).exists():
        return None
    repo, sub = "/".join(parts[:2]), "/".join(parts[2:])
    try:
        from huggingface_hub import list_repo_files, snapshot_download

        files = [f for f in list_repo_files(repo) if f.startswith(f"{sub}/" if sub else "")]
        if not any(f.endswith(".pt") for f in files) or any(f.endswith("model.safetensors") for f in files):
            return None
        root = snapshot_download(repo, allow_patterns=[f"{sub}/*" if sub else "*"])
    except Exception:  # offline, private or missing: not an R2R router we can read
        return None
    return Path(root) / sub if sub else Path(root)


def load_r2r(source, slm, threshold: float | None = None) -> R2RRouter | None:
    """An :class:`R2RRouter` for ``slm`` from an R2R checkpoint (file, folder or Hub id), or None when
    ``source`` is not one (another router format). ``threshold`` overrides the checkpoint's."""
    if isinstance(source, R2RRouter):
        return source
    if not isinstance(source, (str, Path)):
        return None
    found = find_checkpoint(source)
    if found is None and isinstance(source, str):
        folder = hub_folder(source)
        found = find_checkpoint(folder) if folder is not None else None
    if found is None:
        return None
    path, folder_tau = found
    ckpt = torch.load(path, map_location="cpu", weights_only=True)
    embed = slm.get_input_embeddings().weight.detach()
    router = router_from_checkpoint(ckpt, embed, threshold if threshold is not None else folder_tau, str(path))
    if router.hidden_size != int(slm.config.get_text_config().hidden_size):
        raise ValueError(f"the R2R router at {path} reads hidden states of size {router.hidden_size}; the SLM's "
                         f"hidden size is {slm.config.get_text_config().hidden_size}. Load the router trained for this SLM.")
    return router.to(embed.device)


class R2RPolicy:
    """R2R routing (implements :class:`~hf_rstitch.core.policies.RoutingPolicy`): after every SLM forward the
    router decides whether the LLM writes the position; after every LLM token the SLM resumes.

    The router's token is the SLM's most likely one (``argmax`` of its logits): the token it writes under greedy
    decoding; R2R's own runtime reads the token the SLM sampled, which differs only under sampling.

    Args:
        router: an :class:`R2RRouter` (:func:`load_r2r`).
        threshold: P(diverges) at or above which the LLM writes (default: the router's own).
    """

    needs_hidden = True

    def __init__(self, router: R2RRouter, threshold: float | None = None):
        from ..core.policies import check_threshold

        self.router = router
        self.threshold = router.threshold if threshold is None else check_threshold(threshold, "R2R threshold")

    kind = "r2r"  # what a request names to route by this server's router (core.policies_rows.ServerRouter)

    def with_threshold(self, threshold: float) -> "R2RPolicy":
        """The same router (its weights shared) at another probability cut-off: a served request's own."""
        return R2RPolicy(self.router, threshold)

    def reset(self) -> None:
        pass

    @torch.no_grad()
    def hand_to_llm(self, step) -> torch.Tensor:
        if step.hidden is None or step.logits is None:
            raise ValueError("R2RPolicy needs the SLM's hidden states and logits (StepView.hidden / .logits); "
                             "this caller passed none.")
        return self.router.diverges(step.hidden, step.logits, self.threshold).to(step.entropy.device)

    def hand_to_slm(self, step) -> torch.Tensor:
        return torch.ones_like(step.entropy, dtype=torch.bool)  # one LLM token, then the SLM again

    def __repr__(self) -> str:
        return f"R2RPolicy(threshold={self.threshold}, hidden_size={self.router.hidden_size})"
