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


def needs_classes(num_classes: int) -> nn.Module:
    """A factory that wants an argument: the seam calls it with none."""
    return tiny_net()


def not_a_module():
    return "a string"


def misnamed_head_net() -> nn.Module:
    """Its ``head_name`` names no layer (a slip: 'fc' where the layers are numbered)."""
    net = tiny_net()
    net.head_name = "fc"
    return net


def conv_head_net() -> nn.Module:
    """A 1x1-convolution classifier (as SqueezeNet's): model.head=linear replaces it, mlp cannot."""
    net = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 10, 1),
                        nn.AdaptiveAvgPool2d(1), nn.Flatten())
    net.head_name = "2"
    return net


def wrapped_head_net() -> nn.Module:
    """Its ``head_name`` names the Sequential around the Linear, not the Linear ('4.0')."""
    net = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                        nn.Sequential(nn.Linear(8, 10)))
    net.head_name = "4"
    return net
