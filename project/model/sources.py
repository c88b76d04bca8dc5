"""What the backbone builder and its helpers (weights files, timm) share, below them all."""

import logging
from dataclasses import dataclass
from pathlib import Path

from torch import nn

from project.errors import ProjectError

log = logging.getLogger("project.model.backbones")
WEIGHT_FILE_SUFFIXES = (".pth", ".pt", ".bin", ".ckpt", ".safetensors")
TIMM_PREFIX = "timm/"
SCRATCH = (None, "", "none", "null")


class WeightsError(ProjectError, ValueError):
    """A weights or head setting that cannot work; the message says what to change."""


@dataclass
class Backbone:
    net: nn.Module
    head_name: str  # qualified name of the new classification head inside ``net``
    pretrained: bool
    weights_note: str  # where the weights came from, or why there are none


def is_scratch(weights: str | None) -> bool:
    return weights is None or str(weights).strip().lower() in SCRATCH


def is_file(weights: str) -> bool:
    path = Path(weights).expanduser()
    return path.suffix in WEIGHT_FILE_SUFFIXES or path.exists()


def warn_no_weights(what: str, reason: str, expected: Path, how: str) -> None:
    """The loud offline warning (torchvision and timm): what is missing, and where to put it."""
    bar = "!" * 88
    log.warning(
        "\n%s\n!! PRETRAINED WEIGHTS NOT AVAILABLE for %s: %s\n"
        "!! Training starts from RANDOM weights (pretrained: false): expect lower accuracy.\n"
        "!! To fix: put the file %s in the folder %s\n!!   (%s),\n"
        "!!   or set model.weights=/path/to/%s. Set model.weights=null to train from scratch.\n%s",
        bar, what, reason, expected.name, expected.parent, how, expected.name, bar)


def head_layer(net: nn.Module, name: str) -> nn.Module:
    """The layer ``name``; a wrong name is one line listing the layers there, not torch's error."""
    try:
        return net.get_submodule(name)
    except AttributeError:
        parent_name = name.rpartition(".")[0]
        while parent_name and parent_name not in dict(net.named_modules()):
            parent_name = parent_name.rpartition(".")[0]  # the deepest part of the name that exists
        parent = net.get_submodule(parent_name) if parent_name else net
        children = [f"{parent_name}.{n}" if parent_name else n for n, _ in parent.named_children()]
        shown = ", ".join(children[:8]) + (", ..." if len(children) > 8 else "") if children else "none"
        raise WeightsError(f"head_name '{name}' names no layer of {type(net).__name__} (its layers there: "
                           f"{shown}): set head_name to its last nn.Linear or nn.Conv2d") from None
