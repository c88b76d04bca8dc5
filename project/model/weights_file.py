"""Weights from a file: a state dict, one with another head, or a checkpoint of this template.

Imported only when ``model.weights`` is a path. Files are read with ``weights_only`` (a file
cannot run code); the file's classification layer is dropped whenever its shape differs (a new
head is made for this data); any other layer that does not fit fails, naming the keys.
"""

from __future__ import annotations

import logging
import pickle
import zipfile
from pathlib import Path

import torch
from torch import nn

from project.model.sources import WeightsError

log = logging.getLogger(__name__)


def read_state_dict(path: Path) -> dict:
    """The tensors of ``.safetensors``, a torch state dict or a Lightning checkpoint."""
    if not path.is_file():
        raise WeightsError(f"model.weights file '{path}' does not exist")
    try:
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file as load_safetensors

            state = load_safetensors(str(path), device="cpu")
        else:
            state = torch.load(path, map_location="cpu", weights_only=True)
    except (OSError, RuntimeError, ValueError, EOFError, KeyError, IndexError, pickle.UnpicklingError,
            zipfile.BadZipFile) as err:  # a text file unpickles as a KeyError deep in torch
        raise WeightsError(f"model.weights file '{path}' is not a readable state dict "
                           f"({type(err).__name__}): give a .pth/.pt/.safetensors file of tensors") from err
    if isinstance(state, dict) and isinstance(state.get("state_dict"), dict):
        state = state["state_dict"]  # a Lightning checkpoint (this template's: keys net.*)
    if not isinstance(state, dict):
        raise WeightsError(f"model.weights file '{path}' holds a {type(state).__name__}, not a state dict")
    return state


def strip_prefix(state: dict, own: dict) -> dict:
    """Remove a wrapper prefix (``net.``, ``model.``, ``module.``) so the keys match ``own``."""
    for prefix in ("net.", "model.", "module.", "backbone."):
        if not any(k in own for k in state) and any(k.startswith(prefix) for k in state):
            state = {k.removeprefix(prefix): v for k, v in state.items() if k.startswith(prefix)}
    return state


def load_matching(net: nn.Module, state: dict, name: str, path: Path, head: str) -> str:
    """Load the tensors of ``state`` that fit ``net``; fail, naming the keys, when any layer
    outside ``head`` is missing or of another shape. Returns what was loaded and dropped."""
    own = net.state_dict()
    state = strip_prefix(state, own)
    fits = {k: v for k, v in state.items() if k in own and own[k].shape == v.shape}
    dropped = sorted(k for k in state if k not in fits)
    missing = sorted(k for k in own if k not in fits and not k.startswith(f"{head}."))
    if missing or not fits:
        shapes = [f"{k} {tuple(state[k].shape)} vs {tuple(own[k].shape)}" for k in dropped if k in own]
        detail = f"; other shapes: {', '.join(shapes[:3])}" if shapes else ""
        raise WeightsError(
            f"model.weights file '{path}' does not fit {name}: {len(missing)} of its layers are "
            f"missing or of another shape (e.g. {missing[:5]}{detail}). Use a state dict or "
            f"checkpoint of a {name}, or set model.backbone to the file's model.")
    net.load_state_dict(fits, strict=False)
    note = f"loaded {len(fits)} tensors from {path}"
    if dropped:
        note += f"; dropped {', '.join(dropped)} (the file's head: a new {head} is trained)"
    log.info("Weights: %s", note)
    return note


def load_file(net: nn.Module, path: Path, name: str, head: str) -> str:
    return load_matching(net, read_state_dict(path), name, path, head)
