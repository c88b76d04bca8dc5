"""Your own network as the backbone: ``model.backbone: package.module:Factory``. Loaded only
for such a name."""

import importlib
from pathlib import Path

from torch import nn

from project.model.sources import Backbone, WeightsError, head_layer, is_file, is_scratch


def load_factory(spec: str, weights: str | None) -> Backbone:
    """Your own network: ``package.module:Factory`` is called with no arguments and returns an
    ``nn.Module`` whose ``head_name`` attribute names its last (classification) layer, which is
    replaced (without the attribute: its last ``nn.Linear``). ``model.weights`` null keeps the
    factory's initialisation, a file path loads into it, DEFAULT keeps what the factory loaded
    (pretrained if it sets ``pretrained = True``)."""
    module_name, _, attr = spec.partition(":")
    try:
        factory = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError, ValueError) as err:
        raise WeightsError(f"model.backbone '{spec}': cannot import it ({type(err).__name__}: {err}); "
                           "expected package.module:Factory, importable from here") from None
    net = factory()
    if not isinstance(net, nn.Module):
        raise WeightsError(f"model.backbone '{spec}' returned a {type(net).__name__}, not a torch nn.Module")
    head_name = getattr(net, "head_name", None) or next(
        (n for n, m in reversed(list(net.named_modules())) if isinstance(m, nn.Linear)), "")
    if not head_name or not isinstance(head_name, str):
        raise WeightsError(f"model.backbone '{spec}': no head to replace; give the module a head_name "
                           "attribute naming its last layer (e.g. self.head_name = 'fc')")
    try:  # before the weights: a file's head is told apart by this name
        head_layer(net, head_name)
    except WeightsError as err:
        raise WeightsError(f"model.backbone '{spec}': {err}") from None
    if is_scratch(weights):
        return Backbone(net, head_name, False, f"{spec} as built (weights: null)")
    if is_file(str(weights)):
        from project.model.weights_file import load_file

        note = load_file(net, Path(str(weights)).expanduser(), spec, head_name)
        return Backbone(net, head_name, True, note)
    pretrained = bool(getattr(net, "pretrained", False))
    return Backbone(net, head_name, pretrained, f"{spec} with the factory's own weights")
