"""Weights from a file: a state dict, one with another head, or a checkpoint of this template.

Imported only when ``model.weights`` is a path. Files are read with ``weights_only`` (a file
cannot run code). The tensors are matched, in this order: by name; by name once a wrapper prefix
(``net.``, ``module.``, ...) is removed; by order, as timm's ``load_checkpoint(remap=True)`` does,
when the file names its tensors as another library does (e.g. efficientnet_pytorch's
``_conv_stem.weight``) but holds every one, in the model's order, of the model's shape. The
file's classification layer is dropped whenever its shape differs (a new head is made for this
data); any other layer that does not fit fails in one line, naming the first differing tensor.
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
COUNTER = "num_batches_tracked"  # a BatchNorm buffer one side may lack: matched by its layer
WRAPPERS = ("state_dict", "model", "state_dict_ema", "model_ema")  # where files keep their tensors


def read_state_dict(path: Path) -> dict:
    """The tensors of ``.safetensors``, a torch state dict or a Lightning checkpoint."""
    if not path.is_file():
        what = "is a folder: name the file in it" if path.is_dir() else "does not exist"
        raise WeightsError(f"model.weights file '{path}' {what}")
    try:
        if path.suffix == ".safetensors":
            from safetensors import SafetensorError
            from safetensors.torch import load_file as load_safetensors

            try:
                state = load_safetensors(str(path), device="cpu")
            except SafetensorError as err:  # truncated, or torch.save's pickle under this name
                raise OSError(f"not a safetensors file: {err}; torch.save writes .pth") from err
        else:
            state = torch.load(path, map_location="cpu", weights_only=True)
    except (OSError, RuntimeError, ValueError, EOFError, KeyError, IndexError, pickle.UnpicklingError,
            zipfile.BadZipFile) as err:  # a text file unpickles as a KeyError deep in torch
        raise WeightsError(f"model.weights file '{path}' is not a readable state dict "
                           f"({type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}): give a "
                           ".pth/.pt/.safetensors file of tensors") from err
    # a Lightning checkpoint (this template's: keys net.*), a training script's {"model": ...},
    # or only an EMA of the weights (timm's)
    for key in WRAPPERS:
        if isinstance(state, dict) and isinstance(state.get(key), dict):
            state = state[key]
            break
    if not isinstance(state, dict):
        raise WeightsError(f"model.weights file '{path}' holds a {type(state).__name__}, not a state dict")
    return state


def _strip(state: dict, own: dict) -> tuple[dict, list[str]]:
    stripped = []
    for prefix in ("net.", "model.", "module.", "backbone."):
        if not any(k in own for k in state) and any(k.startswith(prefix) for k in state):
            state = {k.removeprefix(prefix): v for k, v in state.items() if k.startswith(prefix)}
            stripped.append(prefix)
    return state, stripped


def strip_prefix(state: dict, own: dict) -> dict:
    """Remove a wrapper prefix (``net.``, ``model.``, ``module.``) so the keys match ``own``."""
    return _strip(state, own)[0]


def _shape(t: torch.Tensor) -> tuple:
    return tuple(t.shape)


def by_order(state: dict, own: dict, head: str) -> tuple[dict, list[str], str]:
    """The file's tensors under the model's names, paired in order (timm's ``remap``): the
    model's ``head`` may differ in shape (its file tensors are then dropped) or be absent from
    the file; BatchNorm counters are paired through their layer, so either side may lack them.
    Returns (the model's name -> the file's tensor, the file's dropped names, the first pair
    in words); raises ``ValueError`` naming the first tensor that differs."""
    files = [k for k, v in state.items() if isinstance(v, torch.Tensor) and not k.endswith(COUNTER)]
    mine = [k for k in own if not k.endswith(COUNTER)]
    body = [k for k in mine if not k.startswith(f"{head}.")]
    target = mine if len(files) > len(body) else body  # the file with or without its head
    loaded, dropped, layers = {}, [], {}
    for i, (fk, mk) in enumerate(zip(files, target, strict=False)):  # lengths: below
        if _shape(state[fk]) != _shape(own[mk]):
            if mk not in body:
                dropped.append(fk)
                continue
            raise ValueError(f"its tensor {i + 1} (BatchNorm counters aside) differs: the file's '{fk}' "
                             f"{_shape(state[fk])} vs the model's '{mk}' {_shape(own[mk])}")
        loaded[mk] = state[fk]
        layers.setdefault(mk.rpartition(".")[0], fk.rpartition(".")[0])
    if len(files) > len(target):
        fk = files[len(target)]
        last = f"after the model's last '{target[-1]}'" if target else "where the model has none"
        raise ValueError(f"the file has {len(files) - len(target)} tensors more, from its '{fk}' "
                         f"{_shape(state[fk])} on, {last}")
    if len(files) < len(target):
        mk = target[len(files)]
        raise ValueError(f"the file ends after {len(files)} tensors, where the model has '{mk}' "
                         f"{_shape(own[mk])} and {len(target) - len(files) - 1} more")
    for mk in own:
        if mk.endswith(COUNTER) and mk.rpartition(".")[0] in layers:
            fk = f"{layers[mk.rpartition('.')[0]]}.{COUNTER}"
            if isinstance(state.get(fk), torch.Tensor) and _shape(state[fk]) == _shape(own[mk]):
                loaded[mk] = state[fk]
    return loaded, dropped, f"its '{files[0]}' is the model's '{target[0]}'" if files else ""


def load_matching(net: nn.Module, state: dict, name: str, path: Path, head: str) -> str:
    """Load the tensors of ``state`` that fit ``net``, by name or else by order; fail in one line,
    naming the keys, when any layer outside ``head`` is missing or of another shape. Returns
    what was loaded, how, and what was dropped."""
    own = net.state_dict()
    state, stripped = _strip(state, own)
    fits = {k: v for k, v in state.items()
            if k in own and isinstance(v, torch.Tensor) and own[k].shape == v.shape}
    dropped = sorted(k for k in state if k not in fits)
    missing = sorted(k for k in own if k not in fits and not k.startswith(f"{head}.")
                     and not (k.endswith(COUNTER) and k.removesuffix(COUNTER) + "running_mean" in fits))
    how = f"by name without the prefix {'+'.join(stripped)}" if stripped else "by name"
    body = {k.split(".", 1)[0] for k in own} - {head.split(".", 1)[0]}
    layers = dict(net.named_modules())  # a tensor of a layer the model's blocks lack (an extra buffer
    extra = [k for k in dropped if k not in own and k.split(".", 1)[0] in body  # of one it has: dropped)
             and k.rpartition(".")[0] not in layers]
    if fits and not missing and extra:  # layers within the model's own blocks: a bigger network's
        raise WeightsError(f"model.weights file '{path}' does not fit {name}: it has layers {name} lacks "
                           f"({', '.join(extra[:3])}{', ...' if len(extra) > 3 else ''}), as a deeper or "
                           f"wider network's would. Use a state dict or checkpoint of a {name}, or set "
                           "model.backbone to the file's model.")
    if missing or not fits:
        try:
            fits, dropped, first = by_order(state, own, head)
        except ValueError as err:
            shapes = [f"{k} {tuple(state[k].shape)} vs {tuple(own[k].shape)}" for k in dropped
                      if k in own and isinstance(state[k], torch.Tensor)]
            detail = f"; other shapes: {', '.join(shapes[:3])}" if shapes else ""
            raise WeightsError(
                f"model.weights file '{path}' does not fit {name}: {len(missing)} of its layers are "
                f"missing or of another shape by name (e.g. {missing[:3]}{detail}), and by order {err}. "
                f"Use a state dict or checkpoint of a {name}, or set model.backbone to the file's model."
            ) from None
        how = f"by order, as timm's remap (the names differ: {first}, and so on; every shape matches)"
    net.load_state_dict(fits, strict=False)
    note = f"loaded {len(fits)} tensors {how} from {path}"
    if dropped:
        note += f"; dropped {', '.join(dropped)} (the file's head: a new {head} is trained)"
    log.info("Weights: %s", note)
    return note


def load_file(net: nn.Module, path: Path, name: str, head: str) -> str:
    return load_matching(net, read_state_dict(path), name, path, head)
