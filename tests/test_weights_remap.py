"""``model.weights`` files matched by name, by name without a wrapper prefix, and by order (timm's
``remap``): a file that names its tensors as another library does (efficientnet_pytorch's
``_conv_stem.weight``, ``_blocks.N...``, ``_fc``) but holds every one, in order, of the right shape.
Nothing is downloaded: the file is made from timm's efficientnet_lite0 built without weights."""

from __future__ import annotations

import logging

import pytest
import torch

timm = pytest.importorskip("timm")

from project.model import ImageClassifier, backbones  # noqa: E402

BACKBONE = "timm/efficientnet_lite0"
# timm's layer names -> efficientnet_pytorch's: the stem and head, then a block's by its kind
TOP = {"conv_stem": "_conv_stem", "bn1": "_bn0", "conv_head": "_conv_head", "bn2": "_bn1",
       "classifier": "_fc"}
SEPARABLE = {"conv_dw": "_depthwise_conv", "bn1": "_bn1", "conv_pw": "_project_conv", "bn2": "_bn2"}
INVERTED = {"conv_pw": "_expand_conv", "bn1": "_bn0", "conv_dw": "_depthwise_conv", "bn2": "_bn1",
            "conv_pwl": "_project_conv", "bn3": "_bn2"}


@pytest.fixture(autouse=True)
def _offline(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf_home"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def efficientnet_pytorch_names(state: dict) -> dict:
    """``state`` of timm's efficientnet_lite0 renamed, in order, as efficientnet_pytorch names it:
    blocks numbered flat (``_blocks.0`` .. ``_blocks.15``)."""
    flat: dict[str, int] = {}
    out = {}
    for key, value in state.items():
        parts = key.split(".")
        if parts[0] == "blocks":
            block = flat.setdefault(".".join(parts[1:3]), len(flat))
            names = SEPARABLE if parts[1] == "0" else INVERTED
            out[".".join(["_blocks", str(block), names[parts[3]], *parts[4:]])] = value
        else:
            out[".".join([TOP[parts[0]], *parts[1:]])] = value
    return out


def a_file(tmp_path, counters: bool = True, **changed) -> tuple[dict, object]:
    """An efficientnet_pytorch-style file of random efficientnet_lite0 weights, 1000 classes."""
    torch.manual_seed(0)
    source = timm.create_model("efficientnet_lite0", pretrained=False, num_classes=1000)
    with torch.no_grad():  # running stats that differ from a fresh model's
        for module in source.modules():
            if isinstance(module, torch.nn.BatchNorm2d):
                module.running_mean.uniform_(-1, 1)
                module.num_batches_tracked.fill_(7)
    state = efficientnet_pytorch_names(source.state_dict())
    if not counters:
        state = {k: v for k, v in state.items() if not k.endswith("num_batches_tracked")}
    state.update(changed)
    path = tmp_path / "efficientnet-lite0.pth"
    torch.save(state, path)
    return state, path


def test_a_file_named_as_efficientnet_pytorch_loads_by_order(tmp_path, caplog):
    state, path = a_file(tmp_path)
    assert len(state) == 296 and "_blocks.15._project_conv.weight" in state
    assert "conv_stem.weight" not in state
    with caplog.at_level(logging.INFO, logger="project.model.weights_file"):
        model = ImageClassifier(num_classes=3, backbone=BACKBONE, weights=str(path), input=32)
    assert model.pretrained and model.net.classifier.out_features == 3
    note = model.weights_note
    assert "loaded 294 tensors by order" in note and str(path) in note and "\n" not in note
    assert "'_conv_stem.weight' is the model's 'conv_stem.weight'" in note
    assert "dropped _fc.weight, _fc.bias" in note  # the file's 1000-class head: a new one is trained
    lines = [r.getMessage() for r in caplog.records if "by order" in r.getMessage()]
    assert len(lines) == 1 and "294 tensors" in lines[0]
    own = model.net.state_dict()
    for mine, theirs in [("conv_stem.weight", "_conv_stem.weight"), ("bn1.running_mean", "_bn0.running_mean"),
                         ("blocks.0.0.conv_dw.weight", "_blocks.0._depthwise_conv.weight"),
                         ("blocks.1.0.conv_pw.weight", "_blocks.1._expand_conv.weight"),
                         ("blocks.6.0.bn3.running_var", "_blocks.15._bn2.running_var"),
                         ("blocks.6.0.bn3.num_batches_tracked", "_blocks.15._bn2.num_batches_tracked"),
                         ("conv_head.weight", "_conv_head.weight"), ("bn2.bias", "_bn1.bias")]:
        assert torch.equal(own[mine], state[theirs]), mine
    assert not torch.equal(own["bn2.running_mean"], torch.zeros_like(own["bn2.running_mean"]))


def test_by_order_without_the_batchnorm_counters_or_with_a_head_of_the_same_shape(tmp_path):
    state, path = a_file(tmp_path, counters=False)
    assert len(state) == 247
    model = ImageClassifier(num_classes=3, backbone=BACKBONE, weights=str(path), input=32)
    assert "loaded 245 tensors by order" in model.weights_note  # the model keeps its own counters
    assert torch.equal(model.net.blocks[4][2].conv_dw.weight, state["_blocks.10._depthwise_conv.weight"])
    assert int(model.net.bn1.num_batches_tracked) == 0
    head = {"_fc.weight": torch.randn(3, 1280), "_fc.bias": torch.randn(3)}  # a head for these classes
    state, path = a_file(tmp_path, counters=False, **head)
    model = ImageClassifier(num_classes=3, backbone=BACKBONE, weights=str(path), input=32)
    assert "loaded 247 tensors by order" in model.weights_note and "dropped" not in model.weights_note
    assert torch.equal(model.net.classifier.weight, state["_fc.weight"])
    headless = {k: v for k, v in state.items() if not k.startswith("_fc.")}
    torch.save(headless, tmp_path / "headless.pth")
    model = ImageClassifier(num_classes=3, backbone=BACKBONE, weights=str(tmp_path / "headless.pth"),
                            input=32)
    assert "loaded 245 tensors by order" in model.weights_note and "dropped" not in model.weights_note


def test_a_file_whose_shapes_differ_fails_in_one_line_naming_the_first_differing_tensor(tmp_path):
    _, path = a_file(tmp_path, **{"_blocks.3._bn1.weight": torch.ones(5)})
    with pytest.raises(backbones.WeightsError) as err:
        ImageClassifier(num_classes=3, backbone=BACKBONE, weights=str(path), input=32)
    message = str(err.value)
    assert "\n" not in message and f"does not fit {BACKBONE}" in message
    assert "the file's '_blocks.3._bn1.weight' (5,) vs the model's 'blocks.2.0.bn2.weight' (144,)" in message
    # one tensor fewer: the file ends early, named where
    state, _ = a_file(tmp_path)
    del state["_conv_head.weight"]
    torch.save(state, tmp_path / "short.pth")
    with pytest.raises(backbones.WeightsError, match=r"tensor \d+ \(BatchNorm counters aside\) differs: "
                       r"the file's '_bn1.weight' "):
        ImageClassifier(num_classes=3, backbone=BACKBONE, weights=str(tmp_path / "short.pth"), input=32)


def test_a_file_with_the_models_names_still_loads_by_name(tmp_path):
    source = timm.create_model("efficientnet_lite0", pretrained=False, num_classes=1000)
    state = {k: v for k, v in source.state_dict().items() if not k.endswith("num_batches_tracked")}
    torch.save(state, tmp_path / "timm.pth")
    model = ImageClassifier(num_classes=3, backbone=BACKBONE, weights=str(tmp_path / "timm.pth"), input=32)
    assert "tensors by name from" in model.weights_note and "by order" not in model.weights_note
    assert torch.equal(model.net.blocks[5][0].conv_pwl.weight, source.blocks[5][0].conv_pwl.weight)
    torch.save({"state_dict": {f"net.{k}": v for k, v in state.items()}}, tmp_path / "run.ckpt")
    model = ImageClassifier(num_classes=3, backbone=BACKBONE, weights=str(tmp_path / "run.ckpt"), input=32)
    assert "by order" not in model.weights_note and "tensors by name" in model.weights_note
