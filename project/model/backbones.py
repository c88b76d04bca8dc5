"""Build a torchvision classifier, load pretrained weights, and give it a new head.

Weights resolve in this order: a local file path, the torch hub cache, a download. When none
works (offline), the run goes on from random weights but says so loudly, names the file and
the folder to put it in, and records ``pretrained: false``. ``timm/<name>`` backbones follow the
same policy with the Hugging Face cache (``project/model/timm_backbones.py``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import torch
import torchvision
from torch import nn

from project.errors import ProjectError

log = logging.getLogger(__name__)
IMAGENET_CLASSES = 1000
WEIGHT_FILE_SUFFIXES = (".pth", ".pt", ".bin", ".ckpt", ".safetensors")
TIMM_PREFIX = "timm/"
SCRATCH = (None, "", "none", "null")


class WeightsError(ProjectError, ValueError):
    """A weights setting that cannot work; the message says what to change."""


@dataclass
class Backbone:
    net: nn.Module
    head_name: str  # qualified name of the new classification layer inside ``net``
    pretrained: bool
    weights_note: str  # where the weights came from, or why there are none


def model_names() -> list[str]:
    return torchvision.models.list_models(module=torchvision.models)


def build(name: str, weights: str | None, num_classes: int, image_size: int | None = None) -> Backbone:
    """The named model with ``weights`` loaded and a fresh ``num_classes`` head: a torchvision
    name, or ``timm/<name>``. ``image_size`` reaches timm models that are built for one input
    size (ViTs); torchvision models take any size and ignore it."""
    if num_classes < 2:
        raise WeightsError(f"model.num_classes must be at least 2, got {num_classes}")
    if name.startswith(TIMM_PREFIX):
        from project.model import timm_backbones

        return timm_backbones.build(name, weights, num_classes, image_size)
    if name not in model_names():
        raise WeightsError(
            f"model.backbone '{name}' is not a torchvision classification model; "
            f"choose one of: {', '.join(model_names())}; or a timm model as timm/<name> "
            "(list them with: python -m project models PATTERN)"
        )
    net, pretrained, note = _load(name, weights)
    return Backbone(net, replace_head(net, num_classes), pretrained, note)


def _load(name: str, weights: str | None) -> tuple[nn.Module, bool, str]:
    if isinstance(weights, str) and weights.strip().lower() in SCRATCH or weights is None:
        return torchvision.models.get_model(name, weights=None), False, "random init (weights: null)"
    path = Path(weights).expanduser()
    if path.suffix in WEIGHT_FILE_SUFFIXES or path.exists():
        net, note = _load_file(name, path)
        return net, True, note
    enum = torchvision.models.get_model_weights(name)
    try:
        spec = enum[weights]
    except KeyError:
        choices = ", ".join(["DEFAULT", *enum.__members__])
        raise WeightsError(
            f"model.weights '{weights}' is neither a file nor a weights name of {name}; "
            f"use a path to a .pth file, null, or one of: {choices}"
        ) from None
    cached = Path(torch.hub.get_dir()) / "checkpoints" / Path(spec.url).name
    source = f"the torch hub cache ({cached})" if cached.is_file() else "a download"
    try:
        net = torchvision.models.get_model(name, weights=spec)
    except Exception as err:  # offline, proxy, corrupt cache: never fatal, always loud
        warn_no_weights(name, str(spec), cached, f"{type(err).__name__}: {err}")
        note = f"NO pretrained weights: {cached} not found"
        return torchvision.models.get_model(name, weights=None), False, note
    return net, True, f"pretrained {spec} from {source}"


def _load_file(name: str, path: Path) -> tuple[nn.Module, str]:
    """``name`` with the weights of a file: a torchvision state dict, one with another head, or a
    checkpoint of this template (any classes). The file's classification layer is dropped
    whenever its shape differs (a new head is made for this data); any other layer that does
    not fit fails, naming the keys."""
    state = read_state_dict(path)
    net = torchvision.models.get_model(name, weights=None)
    return net, load_matching(net, state, name, path, find_head(net))


def read_state_dict(path: Path) -> dict:
    """The tensors of a weights file: ``.safetensors``, or a torch state dict or Lightning
    checkpoint (loaded with ``weights_only``: a file cannot run code)."""
    if not path.is_file():
        raise WeightsError(f"model.weights file '{path}' does not exist")
    try:
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file

            state = load_file(str(path), device="cpu")
        else:
            state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:
        raise WeightsError(f"model.weights file '{path}' is not a readable state dict: {err}") from err
    if isinstance(state, dict) and isinstance(state.get("state_dict"), dict):
        state = state["state_dict"]  # a Lightning checkpoint (this template's: keys net.*)
    if not isinstance(state, dict):
        raise WeightsError(f"model.weights file '{path}' holds a {type(state).__name__}, not a state dict")
    return state


def load_matching(net: nn.Module, state: dict, name: str, path: Path, head: str) -> str:
    """Load the tensors of ``state`` that fit ``net`` (after removing a wrapper prefix); fail,
    naming the keys, when any layer outside ``head`` is missing or of another shape."""
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


def strip_prefix(state: dict, own: dict) -> dict:
    """Remove a wrapper prefix (``net.``, ``model.``, ``module.``) so the keys match ``own``."""
    for prefix in ("net.", "model.", "module.", "backbone."):
        if not any(k in own for k in state) and any(k.startswith(prefix) for k in state):
            state = {k.removeprefix(prefix): v for k, v in state.items() if k.startswith(prefix)}
    return state


def warn_no_weights(name: str, spec: str, cached: Path, reason: str) -> None:
    bar = "!" * 88
    log.warning(
        "\n%s\n!! PRETRAINED WEIGHTS NOT AVAILABLE for %s (%s): %s\n"
        "!! Training starts from RANDOM weights (pretrained: false): expect lower accuracy.\n"
        "!! To fix: put the file %s in the folder %s\n"
        "!!   (copy it from a machine with network access, or set TORCH_HOME),\n"
        "!!   or set model.weights=/path/to/%s. Set model.weights=null to train from scratch.\n%s",
        bar, name, spec, reason, cached.name, cached.parent, cached.name, bar,
    )


def find_head(net: nn.Module) -> str:
    """Name of the last layer that produces the 1000 ImageNet logits (Linear, or Conv2d)."""
    found = ""
    for module_name, module in net.named_modules():
        if isinstance(module, nn.Linear) and module.out_features == IMAGENET_CLASSES or (
            isinstance(module, nn.Conv2d) and module.out_channels == IMAGENET_CLASSES
        ):
            found = module_name
    if not found:
        raise WeightsError(f"cannot find the classification layer of {type(net).__name__}")
    return found


def replace_head(net: nn.Module, num_classes: int) -> str:
    """Swap the ImageNet head for a new ``num_classes`` layer; only it is randomly initialised."""
    name = find_head(net)
    parent_name, _, child = name.rpartition(".")
    parent = net.get_submodule(parent_name) if parent_name else net
    old = getattr(parent, child)
    if isinstance(old, nn.Linear):
        new: nn.Module = nn.Linear(old.in_features, num_classes, bias=old.bias is not None)
    else:
        new = nn.Conv2d(old.in_channels, num_classes, old.kernel_size, old.stride, old.padding)
    setattr(parent, child, new)
    if hasattr(net, "num_classes"):
        net.num_classes = num_classes
    return name


def weights_preprocessing(name: str, weights: str | None) -> dict:
    """Evaluation preprocessing of torchvision weights (crop ratio, interpolation, mean, std),
    read from the weights' own ``transforms()`` without loading them (timm: the weights'
    ``pretrained_cfg``); ImageNet's convention for random weights and torchvision files."""
    out = {"crop_ratio": 0.875, "interpolation": "bilinear", "mean": [0.485, 0.456, 0.406],
           "std": [0.229, 0.224, 0.225]}
    if weights is None or str(weights).strip().lower() in SCRATCH:
        return out
    if name.startswith(TIMM_PREFIX):  # the weights' pretrained_cfg; cheap: no model is built
        from project.model import timm_backbones

        return timm_backbones.preprocessing(name, weights) or out
    try:
        spec = torchvision.models.get_model_weights(name)[weights]
    except (KeyError, ValueError):
        return out  # a file: assume the ImageNet convention
    t = spec.transforms()
    return {"crop_ratio": t.crop_size[0] / t.resize_size[0], "interpolation": t.interpolation.value,
            "mean": list(t.mean), "std": list(t.std)}
