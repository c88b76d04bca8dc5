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


def make_param_groups(net: nn.Module, head_name: str, lr: float, head_lr_mult: float,
                      layer_decay: float | None = None) -> list[dict]:
    """Named groups: ``backbone``, ``backbone_no_decay``, ``head``, ``head_no_decay``.

    Decayed groups take the optimiser's own ``weight_decay``; the others set it to 0. With
    ``layer_decay`` (timm's layer-wise LR decay) the backbone is split further by block
    (``backbone.layer3``, ...): the last block learns at ``lr``, each earlier one ``layer_decay``
    times slower, so the generic early features move least. Empty groups are left out.
    """
    blocks = param_blocks(net, head_name)
    order = list(dict.fromkeys(b for b in blocks.values() if b != "head"))
    head_prefix = f"{head_name}."
    buckets: dict[str, tuple[float, list[nn.Parameter]]] = {}
    for name, param in net.named_parameters():
        if name.startswith(head_prefix):
            part, scale = "head", head_lr_mult
        elif layer_decay is None:
            part, scale = "backbone", 1.0
        else:
            block = blocks.get(name, order[0] if order else "stem")
            depth = order.index(block) if block in order else 0
            part, scale = f"backbone.{block}", layer_decay ** (len(order) - depth)
        key = part + ("_no_decay" if no_decay(name, param) else "")
        buckets.setdefault(key, (scale, []))[1].append(param)
    groups = []
    for name, (scale, params) in buckets.items():
        group: dict = {"params": params, "name": name, "lr": lr * scale}
        if name.endswith("_no_decay"):
            group["weight_decay"] = 0.0
        groups.append(group)
    return groups


def param_blocks(net: nn.Module, head_name: str = "") -> dict[str, str]:
    """Parameter name -> block: ``stem`` (single layers before the first block), the items of
    the first long Sequential/ModuleList in each top-level module (``layer1.0``, ``features.3``,
    ``encoder.layers.encoder_layer_5``; a ResNet stage of a few blocks stays ``layer1``), the
    other top-level modules by name, and ``head``. A timm model brings its own grouping (the one
    its layer decay uses): ``layer000`` (stem) upwards."""
    if callable(getattr(net, "group_matcher", None)):
        from timm.models import group_parameters

        layer = group_parameters(net, net.group_matcher(coarse=False), reverse=True)
        return {n: "head" if n.startswith(f"{head_name}.") else f"layer{layer.get(n, 0):03d}"
                for n, _ in net.named_parameters()}
    blocks: dict[str, str] = {}
    seen_block = False
    head_top = head_name.split(".")[0]
    for top, child in net.named_children():
        names = [n for n, _ in child.named_parameters()]
        if not names:
            continue
        if top == head_top:  # the head, and layers beside it (e.g. a final norm): the last block
            blocks.update({f"{top}.{n}": "head" if f"{top}.{n}".startswith(f"{head_name}.")
                           else f"{top}_pre_head" for n in names})
            continue
        if not list(child.children()):  # a single layer: part of the stem until a block is seen
            blocks.update({f"{top}.{n}": "stem" if not seen_block else top for n in names})
            continue
        seen_block = True
        inner = next((p for p, m in child.named_modules()
                      if isinstance(m, nn.Sequential | nn.ModuleList) and len(m) >= LONG), None)
        for n in names:
            block = top
            if inner is not None and n.startswith(f"{inner}." if inner else ""):
                rest = n[len(inner) + 1:] if inner else n
                block = ".".join(filter(None, [top, inner, rest.split(".")[0]]))
            blocks[f"{top}.{n}"] = block
    return blocks


LONG = 6  # a container of at least this many items is split into its items
