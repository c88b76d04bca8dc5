"""The LR schedule step by step, min_lr at the end of a real run, and the training loss options
(class_weights, label_smoothing) checked against values computed by hand."""

from __future__ import annotations

from pathlib import Path

import lightning as L
import pytest
import torch
import torch.nn.functional as F
from lightning.pytorch.callbacks import Callback

from project.data import FolderDataModule
from project.data.demo import make_demo
from project.model import ImageClassifier
from project.model.schedule import step_schedule

# -- the schedule on its own -------------------------------------------------------------------
PER_EPOCH, TOTAL = 10, 100
START, END = 0.01, 0.1


def _schedule(**kw):
    return step_schedule(lambda: (PER_EPOCH, TOTAL), warmup_epochs=2, start_factor=START,
                         end_factor=END, **kw)


def test_step_schedule_warms_up_then_decays_to_the_end_factor():
    f = _schedule()
    assert f(0) == pytest.approx(START)
    assert f(10) == pytest.approx(START + (1 - START) / 2)  # halfway through the 20 warmup steps
    assert f(20) == pytest.approx(1.0)
    # LambdaLR is stepped after each optimizer step, so after the last of the TOTAL steps the
    # optimiser holds factor(TOTAL): the value a finished run ends with (min_lr / lr).
    assert f(TOTAL) == pytest.approx(END)
    assert f(TOTAL - 1) > END
    assert f(TOTAL + 5) == pytest.approx(END)  # beyond the estimate it stays there
    warmup = [f(s) for s in range(0, 21)]
    assert all(a < b for a, b in zip(warmup, warmup[1:], strict=False))
    decay = [f(s) for s in range(20, TOTAL + 1)]
    assert all(a > b for a, b in zip(decay, decay[1:], strict=False))  # strictly down after warmup
    assert f(60) == pytest.approx(END + (1 - END) / 2)  # the cosine's midpoint


def test_step_schedule_frozen_epochs_and_lazy_lengths():
    frozen = _schedule(frozen_epochs=1)
    assert [frozen(s) for s in range(PER_EPOCH)] == [0.0] * PER_EPOCH
    plain = _schedule()
    for s in range(PER_EPOCH, TOTAL + 1):  # afterwards the same schedule, not a shifted one
        assert frozen(s) == pytest.approx(plain(s))
    assert frozen(PER_EPOCH) > 0

    asked = []

    def lengths():
        asked.append(1)
        return PER_EPOCH, TOTAL

    f = step_schedule(lengths, warmup_epochs=2, start_factor=START, end_factor=END)
    assert f(0) == pytest.approx(START) and not asked  # step 0 (LambdaLR's construction): not asked
    f(1), f(50)
    assert len(asked) == 1  # asked once, at the first real step
    assert step_schedule(lengths, warmup_epochs=0, start_factor=START)(0) == 1.0


# -- real training -----------------------------------------------------------------------------
def _trainer(**kw) -> L.Trainer:
    defaults = dict(accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                    enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0,
                    num_sanity_val_steps=0)
    return L.Trainer(**{**defaults, **kw})


def _data(path: Path, batch_size: int) -> FolderDataModule:
    return FolderDataModule(path, image_size=32, batch_size=batch_size, num_workers=0)


class FirstStep(Callback):
    """The first training batch, the logits the model gives it (same weights and mode as the
    step itself, before the optimiser moves them) and the loss the step returns."""

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if trainer.global_step == 0:
            self.x, self.y = (t.clone() for t in batch)
            with torch.no_grad():
                self.logits = pl_module(self.x).float()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if not hasattr(self, "loss"):
            loss = outputs["loss"] if isinstance(outputs, dict) else outputs
            self.loss = loss.detach().float()


class LrTrace(Callback):
    """The LR of every param group at every optimizer step, and at the end."""

    def __init__(self) -> None:
        self.steps: list[list[float]] = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.steps.append([g["lr"] for g in trainer.optimizers[0].param_groups])


def test_a_run_ends_at_min_lr(tiny_data):
    lr, min_lr, warmup_lr = 0.01, 1e-4, 1e-3
    torch.manual_seed(0)
    # warmup: 2 of the 12 steps, short enough that no cap on the warmup's share applies
    model = ImageClassifier(num_classes=3, weights=None, lr=lr, min_lr=min_lr, warmup_epochs=1 / 3,
                            warmup_start_lr=warmup_lr)
    trace = LrTrace()
    trainer = _trainer(max_epochs=2, callbacks=[trace])
    trainer.fit(model, _data(tiny_data, batch_size=4))  # 24 images: 6 steps an epoch, 12 in all
    assert trainer.global_step == 12 and len(trace.steps) == 12
    groups = trainer.optimizers[0].param_groups
    # Without pretrained weights the head learns at the body's rate, so every group (backbone
    # and head, with and without weight decay) follows the one schedule.
    assert all(g["initial_lr"] == pytest.approx(lr) for g in groups)
    for g in groups:
        assert g["lr"] == pytest.approx(min_lr, abs=1e-9)
    expected = step_schedule(lambda: (6, 12), 1 / 3, warmup_lr / lr, min_lr / lr)
    for step, lrs in enumerate(trace.steps):  # and on the way there, the schedule above
        assert lrs == pytest.approx([lr * expected(step)] * len(groups), abs=1e-9), step
    assert trace.steps[0][0] == pytest.approx(warmup_lr)
    assert trace.steps[2][0] == pytest.approx(lr)  # warmup over after 2 steps


@pytest.fixture(scope="module")
def imbalanced_data(tmp_path_factory) -> Path:
    """3 classes with 8, 4 and 2 training images."""
    out = tmp_path_factory.mktemp("data") / "imbalanced"
    return make_demo(out, train_per_class=8, val_per_class=1, test_per_class=1, image_size=32,
                     num_classes=3, imbalance=0.25, seed=2)


def test_balanced_class_weights_are_inverse_frequencies(imbalanced_data):
    # counted from the folders, not from the data module
    classes = sorted(p.name for p in (imbalanced_data / "train").iterdir())
    counts = torch.tensor([len(list((imbalanced_data / "train" / c).glob("*.png"))) for c in classes])
    assert counts.tolist() == [8, 4, 2]
    weights = counts.sum() / (len(classes) * counts.double())  # 14 / (3 x count)

    torch.manual_seed(0)
    model = ImageClassifier(num_classes=3, weights=None, class_weights="balanced")
    first = FirstStep()
    trainer = _trainer(max_steps=1, callbacks=[first])
    trainer.fit(model, _data(imbalanced_data, batch_size=14))  # one batch: every image
    # The loss weights the module keeps (in its state, so checkpoints carry them)...
    assert torch.allclose(model.state_dict()["class_weight"].double(), weights, rtol=1e-6)
    # ...and the loss the step trained on: the cross-entropy with those weights
    assert first.y.bincount(minlength=3).tolist() == [8, 4, 2]
    expected = F.cross_entropy(first.logits, first.y, weight=weights.float())
    assert first.loss.item() == pytest.approx(expected.item(), rel=1e-5)
    assert abs(expected - F.cross_entropy(first.logits, first.y)) > 1e-3  # weights matter here


def test_label_smoothing_is_in_the_training_loss(tiny_data):
    eps = 0.2
    torch.manual_seed(0)
    model = ImageClassifier(num_classes=3, weights=None, label_smoothing=eps)
    first = FirstStep()
    trainer = _trainer(max_steps=1, callbacks=[first])
    trainer.fit(model, _data(tiny_data, batch_size=8))
    assert len(first.y) == 8
    expected = F.cross_entropy(first.logits, first.y, label_smoothing=eps)
    assert first.loss.item() == pytest.approx(expected.item(), rel=1e-5)
    assert abs(expected - F.cross_entropy(first.logits, first.y)) > 1e-3  # smoothing matters here
