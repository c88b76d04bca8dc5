"""Parameter groups: backbone and head, each with and without weight decay (it only hurts norms and
biases); every parameter has a group from the start, so unfreezing never adds one mid-run."""

from torch import nn


def no_decay(name: str, param: nn.Parameter) -> bool:
    """Norm weights, biases, and any other 1-D parameter (e.g. layer scales)."""
    return param.ndim <= 1 or name.endswith(".bias")


def make_param_groups(net: nn.Module, head_name: str, lr: float, head_lr_mult: float,
                      layer_decay: float | None = None) -> list[dict]:
    """Groups ``backbone``, ``head`` and their ``_no_decay`` twins; with ``layer_decay`` the backbone
    splits by block, each ``layer_decay`` times slower than the next."""
    scale_of = None
    if layer_decay is not None:
        from project.model.layer_decay import block_scales

        scale_of = block_scales(net, head_name, layer_decay)
    buckets: dict[str, tuple[float, list[nn.Parameter]]] = {}
    for name, param in net.named_parameters():
        if name.startswith(f"{head_name}."):
            part, scale = "head", head_lr_mult
        elif scale_of is None:
            part, scale = "backbone", 1.0
        else:
            block, scale = scale_of[name]
            part = f"backbone.{block}"
        key = part + ("_no_decay" if no_decay(name, param) else "")
        buckets.setdefault(key, (scale, []))[1].append(param)
    groups = []
    for name, (scale, params) in buckets.items():
        group: dict = {"params": params, "name": name, "lr": lr * scale}
        if name.endswith("_no_decay"):
            group["weight_decay"] = 0.0
        groups.append(group)
    return groups
