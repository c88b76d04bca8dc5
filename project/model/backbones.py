"""The network (torchvision, ``timm/<name>`` or ``package.module:Factory``), its weights and a new
head; offline, a run goes on from random weights but says so loudly, naming the file to fetch."""

import pickle
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch
import torchvision
from torch import nn

from project.common.preprocessing import IMAGENET_MEAN, IMAGENET_STD, Input, Preprocessing, from_plain
from project.model.sources import (
    TIMM_PREFIX,
    Backbone,
    WeightsError,
    head_layer,
    is_file,
    is_scratch,
    warn_no_weights,
)

IMAGENET_CLASSES = 1000
HeadKind = Literal["linear", "mlp"]


@dataclass(frozen=True)
class Head:
    """The new classification layer (``model.head``): ``linear``, or ``mlp`` (Linear, GELU, Dropout,
    Linear)."""

    kind: HeadKind = "linear"
    hidden: int = 512
    dropout: float = 0.0

    @classmethod
    def of(cls, value: "Head | dict | str") -> "Head":
        """A head from the config (a group), a checkpoint (a dict) or Python (``"mlp"``), checked."""
        head = cls(value) if isinstance(value, str) else from_plain(cls, value, "model.head")
        if head.kind not in ("linear", "mlp") or head.hidden < 1 or not 0 <= head.dropout < 1:
            raise WeightsError("model.head: kind must be linear or mlp, hidden >= 1 and dropout in [0, 1), "
                               f"got {head}")
        return head

    def build(self, in_features: int, num_classes: int) -> nn.Module:
        if self.kind == "linear":
            return nn.Linear(in_features, num_classes)
        return nn.Sequential(nn.Linear(in_features, self.hidden), nn.GELU(), nn.Dropout(self.dropout),
                             nn.Linear(self.hidden, num_classes))


def build(name: str, weights: str | None, num_classes: int, head: Head = Head(),
          image_size: int | None = None) -> Backbone:
    """The model with ``weights`` and a new ``num_classes`` head, checked to answer that many values."""
    if num_classes < 1:  # outputs: classes, labels, or values of a regression
        raise WeightsError(f"model.num_classes must be at least 1, got {num_classes}")
    if name.startswith(TIMM_PREFIX):
        from project.extras import timm_hub

        backbone = timm_hub.build(name, weights, num_classes, image_size)
    elif ":" in name:  # your own network
        from project.model.factory import load_factory

        backbone = load_factory(name, weights)
    else:
        known = torchvision.models.list_models(module=torchvision.models)
        if name not in known:
            from project.model.backbone_errors import unknown_backbone

            raise unknown_backbone(name, known)
        net, pretrained, note = load_torchvision(name, weights)
        backbone = Backbone(net, find_head(net), pretrained, note)
    if not (name.startswith(TIMM_PREFIX) and head.kind == "linear"):  # timm made its own new head
        replace_head(backbone.net, backbone.head_name, num_classes, head)
    check_outputs(backbone, name, num_classes, image_size)
    return backbone


def check_outputs(backbone: Backbone, name: str, num_classes: int, image_size: int | None) -> None:
    """One forward of a blank image: a head left unreplaced or a size the network cannot take is
    one line now, not an error deep inside a metric halfway into a run."""
    net, size = backbone.net, image_size or 224
    was_training = net.training
    net.eval()
    try:
        with torch.no_grad():
            out = net(torch.zeros(1, 3, size, size))
    except (RuntimeError, AssertionError, ValueError) as err:
        from project.model.backbone_errors import size_error

        raise size_error(net, name, size, err) from None
    finally:
        net.train(was_training)
    if not isinstance(out, torch.Tensor) or tuple(out.shape) != (1, num_classes):
        from project.model.backbone_errors import shape_error

        raise shape_error(out, name, num_classes, backbone.head_name)


def load_torchvision(name: str, weights: str | None) -> tuple[nn.Module, bool, str]:
    if is_scratch(weights):
        return torchvision.models.get_model(name, weights=None), False, "random init (weights: null)"
    if is_file(str(weights)):
        from project.model.weights_file import load_file

        net = torchvision.models.get_model(name, weights=None)
        return net, True, load_file(net, Path(str(weights)).expanduser(), name, find_head(net))
    enum = torchvision.models.get_model_weights(name)
    try:
        spec = enum[weights]
    except KeyError:
        from project.model.backbone_errors import unknown_weights

        raise unknown_weights(name, weights, enum) from None
    cached = Path(torch.hub.get_dir()) / "checkpoints" / Path(spec.url).name
    source = f"the torch hub cache ({cached})" if cached.is_file() else "a download"
    try:
        net = torchvision.models.get_model(name, weights=spec)
    except (OSError, RuntimeError, ValueError, EOFError, pickle.UnpicklingError) as err:  # offline, proxy,
        # a corrupt cache: loud, not fatal
        warn_no_weights(f"{name} ({spec})", f"{type(err).__name__}: {err}", cached,
                        "copy it from a machine with network access, or set TORCH_HOME")
        state = "does not load: replace it" if cached.is_file() else "not found"
        note = f"NO pretrained weights: {cached} {state}"
        return torchvision.models.get_model(name, weights=None), False, note
    return net, True, f"pretrained {spec} from {source}"


def find_head(net: nn.Module) -> str:
    """Name of the last layer that produces the 1000 ImageNet logits (Linear, or Conv2d)."""
    found = ""
    for module_name, module in net.named_modules():
        if isinstance(module, nn.Linear) and module.out_features == IMAGENET_CLASSES or (
                isinstance(module, nn.Conv2d) and module.out_channels == IMAGENET_CLASSES):
            found = module_name
    if not found:
        raise WeightsError(f"cannot find the classification layer of {type(net).__name__}")
    return found


def replace_head(net: nn.Module, name: str, num_classes: int, head: Head) -> None:
    """Put a new ``head`` for ``num_classes`` where the layer ``name`` is; only it is random."""
    parent_name, _, child = name.rpartition(".")
    old = head_layer(net, name)
    parent = net.get_submodule(parent_name) if parent_name else net
    if isinstance(old, nn.Linear):
        new = head.build(old.in_features, num_classes)
    elif isinstance(old, nn.Conv2d) and head.kind == "linear":
        new = nn.Conv2d(old.in_channels, num_classes, old.kernel_size, old.stride, old.padding)
    else:  # an mlp for a Conv2d, or neither kind
        from project.model.backbone_errors import head_error

        raise head_error(net, name, old, head.kind)
    setattr(parent, child, new)
    if hasattr(net, "num_classes"):
        net.num_classes = num_classes


def resolve_preprocessing(backbone: str, weights: str | None, given: Input | dict | int) -> Preprocessing:
    """The one resolver of a model's input: a value given wins, else the weights' own, else ImageNet's."""
    given = Input.of(given)
    base = {"size": 224, "crop_ratio": 0.875, "interpolation": "bilinear", "mean": IMAGENET_MEAN,
            "std": IMAGENET_STD}
    if ":" in backbone or is_scratch(weights):  # an own network or random weights: ImageNet's
        pass
    elif backbone.startswith(TIMM_PREFIX):
        from project.extras import timm_hub

        base.update(timm_hub.preprocessing(backbone, str(weights)) or {})
    else:
        try:
            enum = torchvision.models.get_model_weights(backbone)
            if is_file(str(weights)):  # the hub's own file, put in place by hand: its weights' input
                weights = next(w.name for w in enum if Path(w.url).name == Path(str(weights)).name)
            t = enum[weights].transforms()
            base.update(size=t.crop_size[0], crop_ratio=t.crop_size[0] / t.resize_size[0],
                        interpolation=t.interpolation.value, mean=t.mean, std=t.std)
        except (KeyError, ValueError, StopIteration):
            pass  # an unknown name fails in its own words when the model is built; other files: ImageNet's
    values = {k: base[k] if getattr(given, k) is None else getattr(given, k) for k in base}
    return Preprocessing(values["size"], float(values["crop_ratio"]), str(values["interpolation"]),
                         tuple(float(m) for m in values["mean"]), tuple(float(s) for s in values["std"]))
