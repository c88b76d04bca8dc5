"""Your own network as the backbone: ``model.backbone: package.module:Factory``. Loaded only
for such a name."""

import importlib
import inspect
from pathlib import Path

from torch import nn

from project.model.sources import Backbone, WeightsError, head_layer, is_file, is_scratch, log


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
    try:
        inspect.signature(factory).bind()
    except TypeError:
        raise WeightsError(f"model.backbone '{spec}' is called with no arguments, and {attr}"
                           f"{inspect.signature(factory)} needs some: give them defaults, or name a "
                           "function of none that calls it") from None
    except ValueError:
        pass  # no signature to read (a builtin): called as it is
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
    if str(weights).strip().upper() != "DEFAULT":  # a mistyped path would train the factory's own
        raise WeightsError(f"model.weights '{weights}': no such file; for your own network (model.backbone "
                           f"'{spec}') it is null, DEFAULT (the weights the factory loads) or a weights file")
    if not getattr(net, "pretrained", False):
        log.warning("Notice: model.weights=DEFAULT keeps what %s built, counted as random weights: set "
                    "`pretrained = True` on the module it returns if it loaded trained ones", spec)
        return Backbone(net, head_name, False, f"{spec} as built, not marked pretrained")
    return Backbone(net, head_name, True, f"{spec} with the factory's own weights")
