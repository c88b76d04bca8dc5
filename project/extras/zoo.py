"""``python -m project models [PATTERN] [--pretrained]``: the names ``model.backbone`` accepts.

Both zoos, one name a line: torchvision's classification models as they are, timm's prefixed
``timm/``. A plain word matches anywhere in a name; ``*``/``?`` patterns match whole names.
"""

from __future__ import annotations

import argparse
import sys
from fnmatch import fnmatchcase

import torchvision

from project.model.backbones import TIMM_PREFIX


def torchvision_names(pattern: str, pretrained: bool) -> list[str]:
    names = [n for n in torchvision.models.list_models(module=torchvision.models) if fnmatchcase(n, pattern)]
    if pretrained:
        names = [n for n in names if len(torchvision.models.get_model_weights(n).__members__)]
    return names


def timm_names(pattern: str, pretrained: bool) -> list[str]:
    """timm's names (with their weights tag when ``pretrained``); none when timm is missing."""
    try:
        import timm
    except ImportError:
        print("(timm is not installed: pip install 'timm>=1.0' to list its models)", file=sys.stderr)
        return []
    return [TIMM_PREFIX + n for n in timm.list_models(pattern, pretrained=pretrained)]


def list_backbones(pattern: str = "*", pretrained: bool = False) -> list[str]:
    """Matching torchvision names, then matching ``timm/`` names; ``timm/...`` lists timm only."""
    only_timm = pattern.startswith(TIMM_PREFIX)
    pattern = pattern.removeprefix(TIMM_PREFIX) or "*"
    if not any(c in pattern for c in "*?["):
        pattern = f"*{pattern}*"
    ours = [] if only_timm else torchvision_names(pattern, pretrained)
    return ours + timm_names(pattern, pretrained)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m project models",
        description="List the backbones model.backbone accepts: torchvision names and timm/<name>.")
    parser.add_argument("pattern", nargs="?", default="*",
                        help="a word (convnext), or a pattern ('resnet*', 'timm/vit_small*')")
    parser.add_argument("--pretrained", action="store_true",
                        help="only models with pretrained weights; timm names then include their "
                             "weights tag (timm/resnet18.a1_in1k)")
    args = parser.parse_args(argv)
    names = list_backbones(args.pattern, args.pretrained)
    for name in names:
        print(name)
    timm_count = sum(n.startswith(TIMM_PREFIX) for n in names)
    print(f"{len(names) - timm_count} torchvision and {timm_count} timm backbones match "
          f"'{args.pattern}'", file=sys.stderr)
    return 0 if names else 1
