"""The model: weights from the cache or a file, the offline fallback, heads, loss, freezing, EMA."""

from __future__ import annotations

import logging
import urllib.error
from pathlib import Path

import lightning as L
import pytest
import torch
import torchvision
from torch import nn

from project.callbacks import default_callbacks
from project.callbacks.ema import ema_update
from project.callbacks.finetune import FreezeBackbone
from project.checkpoints import load_model, read_checkpoint
from project.common.preprocessing import Preprocessing
from project.data import FolderDataModule
from project.errors import CheckpointError
from project.extras.deploy.export import export_checkpoint
from project.model import ImageClassifier, backbones
from project.model.mixing import batch_mixing
from tests.conftest import CLASSES, QUICK, best_ckpt, cli, fit_args, only_run


def _trainer(**options) -> L.Trainer:
    defaults = dict(max_epochs=2, limit_val_batches=1, logger=False, enable_checkpointing=False,
                    enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0)
    return L.Trainer(**{**defaults, **options})


def _cache_file(torch_home: Path, name: str) -> Path:
    spec = torchvision.models.get_model_weights(name).DEFAULT
    return torch_home / "hub" / "checkpoints" / Path(spec.url).name


def test_pretrained_weights_come_from_the_hub_cache_and_the_head_is_new(_no_downloads):
    torch.manual_seed(0)
    reference = torchvision.models.resnet18()
    path = _cache_file(_no_downloads, "resnet18")
    path.parent.mkdir(parents=True)
    torch.save(reference.state_dict(), path)
    model = ImageClassifier(num_classes=5, weights="DEFAULT")
    assert model.pretrained and str(path) in model.weights_note
    for name, tensor in reference.state_dict().items():
        if not name.startswith("fc."):
            assert torch.equal(model.net.state_dict()[name], tensor), name
    assert model.net.fc.out_features == 5
    groups = {g["name"]: g for g in model.param_groups()}
    assert groups["head"]["lr"] == 10 * groups["backbone"]["lr"]  # the body learns 10x slower
    # no weight decay on norms, biases and other 1-D parameters; every parameter in one group
    assert all(p.ndim >= 2 for p in groups["backbone"]["params"] + groups["head"]["params"])
    assert all(p.ndim == 1 for p in groups["backbone_no_decay"]["params"] + groups["head_no_decay"]["params"])
    assert sum(len(g["params"]) for g in groups.values()) == len(list(model.parameters()))
    # the evaluation preprocessing is the weights' own
    assert model.preprocessing.crop_ratio == pytest.approx(224 / 256)


def test_offline_the_run_warns_and_records_pretrained_false(monkeypatch, caplog, tiny_data, tmp_path):
    def offline(*args, **kwargs):
        raise urllib.error.URLError("no network")

    monkeypatch.setattr(torch.hub, "load_state_dict_from_url", offline)
    monkeypatch.setattr(torchvision.models._api, "load_state_dict_from_url", offline, raising=False)
    with caplog.at_level(logging.WARNING):
        model = ImageClassifier(num_classes=5, weights="DEFAULT", input=32)
    assert not model.pretrained and model.head_lr_mult == 1.0
    assert "PRETRAINED WEIGHTS NOT AVAILABLE" in caplog.text
    assert "resnet18-f37072fd.pth" in caplog.text and "hub/checkpoints" in caplog.text
    logger = L.pytorch.loggers.CSVLogger(tmp_path)
    _trainer(max_epochs=1, limit_train_batches=1, logger=logger, callbacks=default_callbacks()).fit(
        model, FolderDataModule(tiny_data, batch_size=4, num_workers=0, preprocessing=model.preprocessing))
    assert logger.experiment.hparams["pretrained"] is False


def test_a_corrupt_cached_file_is_named_as_such_not_as_missing(monkeypatch, tmp_path):
    monkeypatch.setenv("TORCH_HOME", str(tmp_path))
    cached = tmp_path / "hub" / "checkpoints" / "resnet18-f37072fd.pth"
    cached.parent.mkdir(parents=True)
    cached.write_bytes(b"cut short")
    model = ImageClassifier(num_classes=5, weights="DEFAULT", input=32)
    assert not model.pretrained and model.weights_note.endswith(f"{cached} does not load: replace it")


def test_a_file_or_a_template_checkpoint_works_as_weights(trained_run, tmp_path):
    reference = torchvision.models.resnet18()
    torch.save(reference.state_dict(), tmp_path / "mine.pth")
    model = ImageClassifier(num_classes=4, weights=str(tmp_path / "mine.pth"))
    assert torch.equal(model.net.conv1.weight, reference.conv1.weight)
    ckpt = best_ckpt(trained_run)  # 5 classes, used for 3
    model = ImageClassifier(num_classes=3, weights=str(ckpt))
    assert model.pretrained and model.net.fc.out_features == 3
    assert torch.equal(model.net.layer4[1].conv2.weight, load_model(ckpt).net.layer4[1].conv2.weight)
    assert "dropped fc.bias, fc.weight" in model.weights_note
    with pytest.raises(backbones.WeightsError, match="does not exist"):
        ImageClassifier(num_classes=4, weights=str(tmp_path / "missing.pth"))
    with pytest.raises(backbones.WeightsError, match="is a folder: name the file in it"):
        ImageClassifier(num_classes=4, weights=str(tmp_path))
    with pytest.raises(backbones.WeightsError, match=r"does not fit efficientnet_b0: \d+ of its layers"):
        ImageClassifier(num_classes=3, backbone="efficientnet_b0", weights=str(tmp_path / "mine.pth"))


def test_weights_files_as_scripts_write_them_load_and_a_bigger_networks_file_does_not(tmp_path):
    """A file wrapped as training scripts save it ({"model": ...}, timm's EMA) loads; resnet34's
    file holds every resnet18 tensor by name and more: loaded, it made a resnet18 with resnet34's
    first blocks, called pretrained. A truncated .safetensors (or torch.save's file under that
    name) is one line."""
    from safetensors.torch import save_file

    reference = torchvision.models.resnet18()
    for key in ("model", "state_dict_ema"):
        torch.save({key: reference.state_dict(), "epoch": 3}, tmp_path / f"{key}.pth")
        model = ImageClassifier(num_classes=4, weights=str(tmp_path / f"{key}.pth"), input=32)
        assert torch.equal(model.net.conv1.weight, reference.conv1.weight), key
    extra = {**reference.state_dict(), "layer1.0.bn1.some_stat": torch.zeros(3)}  # a buffer of a layer it has
    torch.save(extra, tmp_path / "extra.pth")
    model = ImageClassifier(num_classes=4, weights=str(tmp_path / "extra.pth"), input=32)
    assert "dropped layer1.0.bn1.some_stat" in model.weights_note
    torch.save(torchvision.models.resnet34().state_dict(), tmp_path / "r34.pth")
    with pytest.raises(backbones.WeightsError, match=r"does not fit resnet18: it has layers resnet18 lacks "
                                                     r"\(layer1\.2\..*deeper or wider"):
        ImageClassifier(num_classes=4, weights=str(tmp_path / "r34.pth"), input=32)
    save_file(reference.state_dict(), tmp_path / "r18.safetensors")
    (tmp_path / "cut.safetensors").write_bytes((tmp_path / "r18.safetensors").read_bytes()[:5000])
    torch.save(reference.state_dict(), tmp_path / "pickled.safetensors")
    for name in ("cut", "pickled"):
        with pytest.raises(backbones.WeightsError, match="is not a readable state dict .*not a safetensors"):
            ImageClassifier(num_classes=4, weights=str(tmp_path / f"{name}.safetensors"), input=32)


@pytest.mark.parametrize(("name", "size", "head"), [
    ("resnet18", 64, "mlp"), ("efficientnet_b0", 64, "linear"), ("efficientnet_b0", 64, "mlp"),
    ("mobilenet_v3_small", 64, "mlp"), ("convnext_tiny", 64, "linear"), ("convnext_tiny", 64, "mlp"),
    ("vit_b_16", 224, "linear"), pytest.param("vit_b_16", 224, "mlp", marks=pytest.mark.slow)])
def test_each_family_gets_a_new_head_of_the_kind_asked(name, size, head):
    model = ImageClassifier(num_classes=5, backbone=name, weights=None, head=backbones.Head(head, 32),
                            input=size)
    layer = model.net.get_submodule(model.head_name)
    linears = [m for m in layer.modules() if isinstance(m, nn.Linear)]
    assert len(linears) == (1 if head == "linear" else 2) and linears[-1].out_features == 5
    assert model(torch.randn(2, 3, size, size)).shape == (2, 5)
    groups = {g["name"]: g["params"] for g in model.param_groups()}
    assert {id(p) for p in groups["head"] + groups["head_no_decay"]} == {id(p) for p in layer.parameters()}


def test_an_mlp_head_trains_exports_and_reloads_from_its_checkpoint(tiny_data, trained_run, tmp_path):
    assert cli(["fit", *fit_args(tiny_data, *QUICK, "--model.head.kind=mlp", "--model.head.hidden=16",
                                 "--model.head.dropout=0.1", epochs=1)], tmp_path) == 0
    ckpt = best_ckpt(only_run(tmp_path / "logs"))
    model = load_model(ckpt)
    assert isinstance(model.net.fc, nn.Sequential) and model.net.fc[0].out_features == 16
    assert torch.equal(model.net.fc[3].weight, read_checkpoint(ckpt)["state_dict"]["net.fc.3.weight"])
    # exported like the linear head: ONNX, checked against PyTorch before it is kept
    report = export_checkpoint(ckpt, tmp_path / "export", ["onnx"], repeats=1)
    assert report["formats"]["onnx"]["max_abs_diff"] <= 1e-4 and (tmp_path / "export/model.onnx").is_file()
    # a checkpoint whose stored head does not match its weights fails in one line, not a raw error
    broken = read_checkpoint(ckpt)
    broken["hyper_parameters"]["head"] = {"kind": "linear", "hidden": 16, "dropout": 0.1}
    torch.save(broken, tmp_path / "broken.ckpt")
    with pytest.raises(CheckpointError, match="does not fit the model its settings describe"):
        load_model(tmp_path / "broken.ckpt")
    # checkpoints from before the head setting load as the linear head they had
    old = read_checkpoint(best_ckpt(trained_run))
    old["hyper_parameters"].pop("head")
    torch.save(old, tmp_path / "old.ckpt")
    assert isinstance(load_model(tmp_path / "old.ckpt").net.fc, nn.Linear)
    # ...and those from before model.head was a group (head: mlp, head_hidden: 16) as theirs
    flat = read_checkpoint(ckpt)
    flat["hyper_parameters"].update(head="mlp", head_hidden=16, head_dropout=0.1)
    torch.save(flat, tmp_path / "flat.ckpt")
    assert load_model(tmp_path / "flat.ckpt").net.fc[0].out_features == 16
    # ...and those from before model.input was a group (image_size, crop_ratio, mean ... flat)
    stored = flat["hyper_parameters"]
    stored.update(image_size=stored["input"]["size"], crop_ratio=0.5, interpolation="nearest",
                  mean=[0.1, 0.2, 0.3], std=[0.3, 0.2, 0.1])
    stored.pop("input")
    torch.save(flat, tmp_path / "flat.ckpt")
    expected = Preprocessing(32, 0.5, "nearest", (0.1, 0.2, 0.3), (0.3, 0.2, 0.1))
    assert load_model(tmp_path / "flat.ckpt").preprocessing == expected


def test_unknown_backbones_and_impossible_heads_list_the_fix():
    with pytest.raises(backbones.WeightsError, match="resnet50"):
        ImageClassifier(num_classes=3, backbone="resnet19", weights=None)
    with pytest.raises(backbones.WeightsError, match="model.head=mlp needs a linear classification layer"):
        ImageClassifier(num_classes=3, backbone="squeezenet1_0", weights=None, head="mlp")


def test_the_loss_holds_label_smoothing_and_balanced_class_weights(tiny_data):
    dm = FolderDataModule(tiny_data, batch_size=8, num_workers=0)
    model = ImageClassifier(num_classes=5, weights=None, label_smoothing=0.2, class_weights="balanced",
                            input=32, label_stats=dm.label_stats)  # as the CLI links them
    dm.preprocessing = model.preprocessing
    _trainer(max_epochs=1, limit_train_batches=1).fit(model, dm)
    assert model.class_weight.tolist() == pytest.approx([1.0] * 5)  # 8 images per class: balanced
    model.class_weight.copy_(torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0]))
    logits, y = torch.randn(10, 5), torch.arange(10) % 5
    expected = nn.functional.cross_entropy(logits, y, weight=model.class_weight, label_smoothing=0.2)
    torch.testing.assert_close(model.loss(logits, y), expected)  # for training and evaluation alike


def test_mixup_and_cutmix_make_soft_targets_that_sum_to_one():
    mix = batch_mixing(4, mixup_alpha=0.4, cutmix_alpha=1.0)
    x, y = torch.rand(16, 3, 8, 8), torch.arange(16) % 4
    torch.manual_seed(0)
    mixed, target = mix(x, y)
    assert target.shape == (16, 4) and mixed.shape == x.shape
    torch.testing.assert_close(target.sum(1), torch.ones(16))
    assert (target.max(1).values < 1).any() and batch_mixing(4, 0.0, 0.0) is None


class _Recorder(L.Callback):
    """Backbone weights and BatchNorm statistics at each epoch end."""

    def __init__(self) -> None:
        self.snapshots: list[dict[str, torch.Tensor]] = []

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        self.snapshots.append({k: v.detach().clone() for k, v in pl_module.net.state_dict().items()
                               if not k.startswith("fc.")})


def test_a_frozen_backbone_keeps_its_weights_and_batchnorm_statistics(tiny_data):
    torch.manual_seed(0)
    model = ImageClassifier(num_classes=5, weights=None, input=32, scheduler=None)
    before = {k: v.clone() for k, v in model.net.state_dict().items() if not k.startswith("fc.")}
    head_before = model.net.fc.weight.detach().clone()
    model.net.conv1.requires_grad_(False)  # the user's own network froze its stem for good
    recorder = _Recorder()
    _trainer(callbacks=[FreezeBackbone(epochs=1), recorder], num_sanity_val_steps=1).fit(
        model, FolderDataModule(tiny_data, batch_size=8, num_workers=0, preprocessing=model.preprocessing))
    frozen, unfrozen = recorder.snapshots
    for key, value in before.items():  # weights and running_mean/var unchanged while frozen
        assert torch.equal(frozen[key], value), key
    assert not torch.equal(model.net.fc.weight, head_before)  # the head did learn
    moved = [k for k in before if not torch.equal(unfrozen[k], before[k])]
    assert any(k.endswith("running_mean") for k in moved) and "layer1.0.conv1.weight" in moved
    assert "conv1.weight" not in moved and not model.net.conv1.weight.requires_grad  # thawed: not this
    assert all(m.training for m in model.net.modules() if isinstance(m, nn.BatchNorm2d))


def test_a_second_fit_thaws_what_the_first_found_trainable():
    """A notebook's second fit of the same network after one that ended frozen: the backbone the
    first fit froze thaws; the stem the user froze stays frozen."""
    from types import SimpleNamespace

    model = ImageClassifier(num_classes=3, weights=None, input=32)
    model.net.conv1.requires_grad_(False)
    freeze = FreezeBackbone(epochs=1)
    for epoch in (0, 1):  # the first fit stops in its frozen epoch; the second starts at epoch 1
        freeze.on_fit_start(SimpleNamespace(), model)
        freeze.on_train_epoch_start(SimpleNamespace(current_epoch=epoch), model)
    assert model.net.layer1[0].conv1.weight.requires_grad and not model.net.conv1.weight.requires_grad


def test_the_ema_update_is_timm_s_rule_for_every_tensor_at_once():
    averaged, current = [torch.zeros(3), torch.zeros(2, 2)], [torch.ones(3), torch.full((2, 2), 2.0)]
    update = ema_update(decay=0.999, warmup=True)
    update(averaged, current, torch.tensor(0))  # decay (1 + 0) / (10 + 0) = 0.1 at the first update
    torch.testing.assert_close(averaged[0], torch.full((3,), 0.9))
    torch.testing.assert_close(averaged[1], torch.full((2, 2), 1.8))
    ema_update(decay=0.5, warmup=False)(averaged, current, torch.tensor(100))
    torch.testing.assert_close(averaged[0], torch.full((3,), 0.95))


def test_ema_weights_are_what_the_best_checkpoint_holds(trained_run):
    ckpt = read_checkpoint(best_ckpt(trained_run))
    raw, ema = ckpt["current_model_state"], ckpt["state_dict"]
    assert not torch.equal(raw["net.fc.weight"], ema["net.fc.weight"])
    model = load_model(best_ckpt(trained_run))
    assert torch.equal(model.net.fc.weight, ema["net.fc.weight"])  # evaluate, predict, export
    assert model.class_names == CLASSES


def test_best_so_far_is_saved_in_the_checkpoint_state():
    model = ImageClassifier(num_classes=3, weights=None)
    model.val_acc_best(torch.tensor(0.75))
    restored = ImageClassifier(num_classes=3, weights=None)
    restored.load_state_dict(model.state_dict())
    restored.val_acc_best(torch.tensor(0.5))  # a worse epoch after the resume
    assert float(restored.val_acc_best.compute()) == 0.75
