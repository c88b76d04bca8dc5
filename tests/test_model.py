"""The model: pretrained weights from the cache, the offline fallback, heads, LR schedule."""

from __future__ import annotations

import logging
import urllib.error
from pathlib import Path

import lightning as L
import pytest
import torch
import torchvision
from torch import nn

from project.data import FolderDataModule
from project.model import ImageClassifier, backbones
from project.model.schedule import warmup_cosine


def _cache_file(torch_home: Path, name: str) -> Path:
    spec = torchvision.models.get_model_weights(name).DEFAULT
    return torch_home / "hub" / "checkpoints" / Path(spec.url).name


def test_pretrained_weights_come_from_the_hub_cache(_no_downloads):
    torch.manual_seed(0)
    reference = torchvision.models.resnet18()
    path = _cache_file(_no_downloads, "resnet18")
    path.parent.mkdir(parents=True)
    torch.save(reference.state_dict(), path)

    model = ImageClassifier(num_classes=3, weights="DEFAULT")
    assert model.pretrained
    for name, tensor in reference.state_dict().items():
        if not name.startswith("fc."):
            assert torch.equal(model.net.state_dict()[name], tensor), name
    assert model.net.fc.out_features == 3
    assert not torch.equal(model.net.fc.weight[:3], reference.fc.weight[:3])
    groups = {g["name"]: g for g in model.param_groups()}
    assert groups["head"]["lr"] == 10 * groups["backbone"]["lr"]  # the body learns 10x slower
    assert groups["head_no_decay"]["lr"] == groups["head"]["lr"]


def test_weights_from_an_explicit_file(tmp_path):
    reference = torchvision.models.resnet18()
    torch.save(reference.state_dict(), tmp_path / "mine.pth")
    model = ImageClassifier(num_classes=4, weights=str(tmp_path / "mine.pth"))
    assert torch.equal(model.net.conv1.weight, reference.conv1.weight)
    with pytest.raises(backbones.WeightsError, match="does not exist"):
        ImageClassifier(num_classes=4, weights=str(tmp_path / "missing.pth"))


def test_offline_fallback_warns_and_records_pretrained_false(monkeypatch, caplog, tiny_data, tmp_path):
    def offline(*args, **kwargs):
        raise urllib.error.URLError("no network")

    monkeypatch.setattr(torch.hub, "load_state_dict_from_url", offline)
    monkeypatch.setattr(torchvision.models._api, "load_state_dict_from_url", offline, raising=False)
    with caplog.at_level(logging.WARNING):
        model = ImageClassifier(num_classes=3, weights="DEFAULT")
    assert not model.pretrained
    assert "PRETRAINED WEIGHTS NOT AVAILABLE" in caplog.text
    assert "resnet18-f37072fd.pth" in caplog.text and "hub/checkpoints" in caplog.text

    from project.callbacks import default_callbacks

    logger = L.pytorch.loggers.TensorBoardLogger(tmp_path, name="run", default_hp_metric=False)
    trainer = L.Trainer(max_epochs=1, limit_train_batches=1, limit_val_batches=1, logger=logger,
                        callbacks=default_callbacks(), enable_progress_bar=False,
                        enable_checkpointing=False)
    trainer.fit(model, FolderDataModule(tiny_data, image_size=32, batch_size=4, num_workers=0))
    assert logger.hparams["pretrained"] is False


@pytest.mark.parametrize(
    ("name", "size"),
    [("resnet18", 64), ("efficientnet_b0", 64), ("mobilenet_v3_small", 64),
     ("convnext_tiny", 64), ("vit_b_16", 224)],
)
def test_head_replaced_for_each_family(name, size):
    model = ImageClassifier(num_classes=5, backbone=name, weights=None)
    head = model.net.get_submodule(model.head_name)
    assert isinstance(head, nn.Linear) and head.out_features == 5
    assert model(torch.randn(2, 3, size, size)).shape == (2, 5)
    groups = {g["name"]: g["params"] for g in model.param_groups()}
    in_head = {id(p) for p in groups["head"] + groups["head_no_decay"]}
    assert in_head == {id(p) for p in head.parameters()}
    assert sum(len(p) for p in groups.values()) == len(list(model.parameters()))
    # weight decay only on weights of 2+ dimensions: norms and biases are in the no-decay groups
    assert all(p.ndim >= 2 for p in groups["backbone"] + groups["head"])
    assert all(p.ndim == 1 for p in groups["backbone_no_decay"] + groups["head_no_decay"])


def test_unknown_backbone_lists_the_choices():
    with pytest.raises(backbones.WeightsError, match="resnet50"):
        ImageClassifier(num_classes=3, backbone="resnet19", weights=None)


def test_warmup_then_cosine():
    f = warmup_cosine(warmup_steps=30, total_steps=130, start_factor=1e-4 / 0.01)
    assert f(0) == pytest.approx(0.01)  # 1e-4 / 0.01
    assert f(15) == pytest.approx(0.01 + 0.99 * 0.5)
    assert f(30) == pytest.approx(1.0)
    assert f(80) == pytest.approx(0.5)
    assert f(130) == pytest.approx(0.0, abs=1e-12)
    values = [f(s) for s in range(30, 131)]
    assert all(a >= b for a, b in zip(values, values[1:], strict=False))
