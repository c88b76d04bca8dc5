"""Freezing, the loss used in evaluation, the optimiser from the config, and resume of the best."""

from __future__ import annotations

import lightning as L
import torch
from torch import nn

from project.data import FolderDataModule
from project.model import ImageClassifier


def _trainer(**options) -> L.Trainer:
    defaults = dict(max_epochs=2, limit_val_batches=1, logger=False, enable_checkpointing=False,
                    enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0)
    return L.Trainer(**{**defaults, **options})


class _Recorder(L.Callback):
    """Backbone weights and BatchNorm statistics at each epoch end."""

    def __init__(self) -> None:
        self.snapshots: list[dict[str, torch.Tensor]] = []

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        self.snapshots.append({k: v.detach().clone() for k, v in pl_module.net.state_dict().items()
                               if not k.startswith("fc.")})


def test_frozen_backbone_keeps_weights_and_batchnorm_statistics(tiny_data):
    torch.manual_seed(0)
    model = ImageClassifier(num_classes=3, weights=None, freeze_backbone_epochs=1,
                            warmup_epochs=0)
    before = {k: v.clone() for k, v in model.net.state_dict().items() if not k.startswith("fc.")}
    head_before = model.net.fc.weight.detach().clone()
    recorder = _Recorder()
    _trainer(callbacks=[recorder]).fit(
        model, FolderDataModule(tiny_data, image_size=32, batch_size=8, num_workers=0))
    frozen, unfrozen = recorder.snapshots
    for key, value in before.items():  # weights and running_mean/var unchanged while frozen
        assert torch.equal(frozen[key], value), key
    assert not torch.equal(model.net.fc.weight, head_before)  # the head did learn
    moved = [k for k in before if not torch.equal(unfrozen[k], before[k])]
    assert any(k.endswith("running_mean") for k in moved) and "conv1.weight" in moved


def test_validation_loss_uses_the_training_loss_and_nll_is_plain():
    model = ImageClassifier(num_classes=3, weights=None, label_smoothing=0.2,
                            class_weights=[1.0, 2.0, 3.0])
    model.class_weight.copy_(torch.tensor([1.0, 2.0, 3.0]))  # what setup("fit") does
    x, y = torch.randn(6, 3, 32, 32), torch.tensor([0, 1, 2, 0, 1, 2])
    model.eval()
    with torch.no_grad():
        logits = model(x)
        model.validation_step((x, y), 0)
    values = model.val_metrics.compute()
    weighted = nn.functional.cross_entropy(logits, y, weight=torch.tensor([1.0, 2.0, 3.0]),
                                           label_smoothing=0.2)
    torch.testing.assert_close(values["val/loss"], weighted)
    torch.testing.assert_close(values["val/nll"], nn.functional.cross_entropy(logits, y))
    assert abs(float(values["val/loss"]) - float(values["val/nll"])) > 1e-3


def test_optimizer_comes_from_the_config_with_no_decay_on_norms_and_biases(tiny_data):
    from project.cli import ProjectCLI

    cli = ProjectCLI(args=["--config", "configs/train.yaml", "--config", "configs/presets/adamw.yaml",
                           f"--data.data_dir={tiny_data}", "--model.weights=null"], run=False)
    optimizer = cli.model.optimizer_factory(cli.model.param_groups())
    assert isinstance(optimizer, torch.optim.AdamW)
    decay = {g["name"]: g["weight_decay"] for g in optimizer.param_groups}
    assert decay == {"backbone": 0.05, "backbone_no_decay": 0.0, "head": 0.05, "head_no_decay": 0.0}


def test_best_so_far_is_saved_in_the_checkpoint_state():
    model = ImageClassifier(num_classes=3, weights=None)
    model.val_acc_best(torch.tensor(0.75))
    state = model.state_dict()
    restored = ImageClassifier(num_classes=3, weights=None)
    restored.load_state_dict(state)
    restored.val_acc_best(torch.tensor(0.5))  # a worse epoch after the resume
    assert float(restored.val_acc_best.compute()) == 0.75
