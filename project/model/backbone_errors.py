"""The messages of a backbone that cannot work (``project/model/backbones.py``), built when one fails."""

import torch
from torch import nn

from project.model.sources import WeightsError


def size_error(net: nn.Module, name: str, size: int, err: Exception) -> WeightsError:
    """A network that cannot take ``size`` px images: the size it needs, or torch's first line."""
    needs = getattr(net, "image_size", None)  # torchvision's ViTs are built for one size
    fix = f"it needs {needs} px: set model.input.size={needs}" if isinstance(needs, int) else (
        str(err).splitlines()[0] if str(err) else type(err).__name__)
    return WeightsError(f"model.backbone {name} cannot take {size} px images (model.input.size): {fix}")


def shape_error(out: object, name: str, num_classes: int, head_name: str) -> WeightsError:
    """A network whose answer per image is not ``num_classes`` values: its head was left as it was."""
    shape = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
    return WeightsError(f"model.backbone {name} answers {shape} per image, not (1, {num_classes}): "
                        f"its head '{head_name}' must be the last layer, replaced for {num_classes} outputs")


def head_error(net: nn.Module, name: str, old: nn.Module, kind: str) -> WeightsError:
    """A head layer that ``model.head`` cannot replace."""
    if isinstance(old, nn.Conv2d):
        return WeightsError(f"model.head={kind} needs a linear classification layer; "
                            f"{type(net).__name__}'s '{name}' is a Conv2d, which only model.head=linear "
                            "replaces: use model.head=linear")
    return WeightsError(f"model.backbone {type(net).__name__}: its head '{name}' is a {type(old).__name__}, "
                        "neither nn.Linear nor nn.Conv2d; head_name must name its last nn.Linear or "
                        "nn.Conv2d (the classification layer)")


def unknown_backbone(name: str, known: list[str]) -> WeightsError:
    return WeightsError(f"model.backbone '{name}' is not a torchvision classification model; choose one "
                        f"of: {', '.join(known)}; or a timm model as timm/<name> (list them with: "
                        "python -m project models PATTERN)")


def unknown_weights(name: str, weights: str | None, enum) -> WeightsError:
    choices = ", ".join(dict.fromkeys(["DEFAULT", *enum.__members__]))  # DEFAULT is a member (an alias) too
    return WeightsError(f"model.weights '{weights}' is neither a file nor a weights name of "
                        f"{name}; use a path to a .pth file, null, or one of: {choices}")
