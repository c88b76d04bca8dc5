"""Parameter groups, made once: backbone and head, each with and without weight decay.

Weight decay pulls weights towards zero; on norm scales, biases and other 1-D parameters that
only hurts (timm's ``param_groups_weight_decay`` does the same). The head learns
``head_lr_mult`` times faster than the pretrained body. Every parameter is in a group from the
start, frozen or not, so freezing and unfreezing never add groups mid-run.
"""

from __future__ import annotations

from torch import nn


def no_decay(name: str, param: nn.Parameter) -> bool:
    """Norm weights, biases, and any other 1-D parameter (e.g. layer scales)."""
    return param.ndim <= 1 or name.endswith(".bias")


def make_param_groups(net: nn.Module, head_name: str, lr: float, head_lr_mult: float) -> list[dict]:
    """Up to four named groups: ``backbone``, ``backbone_no_decay``, ``head``, ``head_no_decay``.

    Decayed groups take the optimiser's own ``weight_decay``; the others set it to 0. Empty
    groups are left out.
    """
    head_prefix = f"{head_name}."
    buckets: dict[str, list[nn.Parameter]] = {
        "backbone": [], "backbone_no_decay": [], "head": [], "head_no_decay": []}
    for name, param in net.named_parameters():
        part = "head" if name.startswith(head_prefix) else "backbone"
        buckets[part + ("_no_decay" if no_decay(name, param) else "")].append(param)
    groups = []
    for name, params in buckets.items():
        if not params:
            continue
        group: dict = {"params": params, "name": name,
                       "lr": lr * (head_lr_mult if name.startswith("head") else 1.0)}
        if name.endswith("_no_decay"):
            group["weight_decay"] = 0.0
        groups.append(group)
    return groups
