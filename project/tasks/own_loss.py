"""``model.loss: package.module:function``, a loss of your own: checked when the model is built
and at each call, so a wrong one is one line naming it, not a traceback from inside Lightning.
Loaded only for such a loss."""

from __future__ import annotations

import inspect

import torch

from project.errors import ConfigError
from project.tasks import load

CALL = "fn(task, logits, target, weight=None) returning one number (docs/your-own-task.md)"


def own_loss(spec: str):
    """The function at ``spec``, wrapped so that what it returns is checked."""
    fn = load(spec, "model.loss")
    if not callable(fn):
        raise ConfigError(f"model.loss '{spec}' is a {type(fn).__name__}, not a function: a loss is {CALL}")
    try:
        inspect.signature(fn).bind(None, None, None, None)
    except TypeError:
        raise ConfigError(f"model.loss '{spec}' takes {inspect.signature(fn)}: a loss is {CALL}") from None
    except ValueError:
        pass  # no signature to read (a builtin): called as it is

    def loss(task, logits: torch.Tensor, target: torch.Tensor, weight: torch.Tensor | None = None):
        value = fn(task, logits, target, weight)
        if not isinstance(value, torch.Tensor) or value.dim() != 0:
            shape = tuple(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__
            raise ConfigError(f"model.loss '{spec}' returned {shape}, not one number: reduce it "
                              "(e.g. .mean()) and return a tensor")
        return value

    return loss
