"""Own networks for the backbone seam's tests (``model.backbone=tests.own_backbone:tiny_net``)."""

from torch import nn


def tiny_net() -> nn.Module:
    """A small CNN whose head is named by ``head_name``, as the seam asks of an own network."""
    net = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 10))
    net.head_name = "5"
    return net


class Twice(nn.Module):
    def forward(self, x):
        return x.repeat(1, 2)


def headless_net() -> nn.Module:
    """Its last Linear is not its last layer: the replaced head does not give the outputs."""
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                         nn.Linear(8, 10), Twice())


def not_a_module():
    return "a string"
