"""Blocks of a backbone, for layer-wise LR decay and per-block gradient norms.

Imported only when ``model.layer_decay`` is set or gradient norms are logged per block.
"""

from __future__ import annotations

from torch import nn

LONG = 6  # a container of at least this many items is split into its items


def param_blocks(net: nn.Module, head_name: str = "") -> dict[str, str]:
    """Parameter name -> block: ``stem`` (single layers before the first block), the items of
    the first long Sequential/ModuleList in each top-level module (``features.3``,
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


def block_scales(net: nn.Module, head_name: str, decay: float) -> dict[str, tuple[str, float]]:
    """Backbone parameter name -> (block, LR scale): the last block 1, each earlier ``decay``
    times less."""
    blocks = param_blocks(net, head_name)
    order = list(dict.fromkeys(b for b in blocks.values() if b != "head"))
    out = {}
    for name, _ in net.named_parameters():
        block = blocks.get(name, order[0] if order else "stem")
        depth = order.index(block) if block in order else 0
        out[name] = (block, decay ** (len(order) - depth))
    return out
