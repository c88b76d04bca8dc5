"""Unlabeled images in training (``data.unlabeled``): FixMatch's objective, the two views, the
stream that follows the labeled batches, and the one-line refusals."""

from __future__ import annotations

import csv
import shutil
from pathlib import Path

import pytest
import torch

from project.checkpoints import read_checkpoint
from project.data import FolderDataModule
from project.data.folders import DataFolderError
from project.data.unlabeled import Unlabeled
from project.data.unlabeled_stream import UnlabeledSampler
from project.errors import ConfigError
from project.model.unlabeled import FixMatch
from project.tasks.single.task import SingleLabel
from tests.conftest import EMA_PRESET, QUICK, cli, fit_args, one_error, only_run, scalars
from tests.test_schedule import EVERY_EPOCH, straight_and_resumed

CLASSES = ["a", "b", "c"]


@pytest.fixture(scope="module")
def unlabeled_dir(tiny_data, tmp_path_factory) -> Path:
    """tiny_data's training images in one flat folder, names without their class, plus one
    file that is not an image."""
    out = tmp_path_factory.mktemp("unlabeled")
    for i, path in enumerate(sorted((tiny_data / "train").rglob("*.png"))):
        shutil.copy(path, out / f"{i:03d}.png")
    (out / "broken.png").write_bytes(b"not a png")
    return out


def test_fixmatch_trains_the_strong_view_on_confident_weak_predictions_only():
    """The weak view's argmax is the target when its softmax reaches the threshold; the loss is
    the strong view's cross-entropy over every unlabeled image (rejected ones count as 0)."""
    identity = torch.nn.Identity()  # the "network" passes logits through
    labeled = torch.tensor([[1.0, 0.0, 0.0]])
    weak = torch.tensor([[6.0, 0.0, 0.0], [0.2, 0.0, 0.1], [0.0, 0.0, 5.0]])  # confident, not, confident
    strong = torch.tensor([[0.5, 1.0, 0.0], [3.0, 0.0, 0.0], [0.0, 2.0, 1.0]])
    fixmatch = FixMatch(SingleLabel(CLASSES), threshold=0.9, weight=2.0)
    logits, loss = fixmatch.step(identity, labeled, (weak, strong))
    assert torch.equal(logits, labeled)
    ce = torch.nn.functional.cross_entropy
    expected = 2.0 * (ce(strong[0:1], torch.tensor([0])) + ce(strong[2:3], torch.tensor([2]))) / 3
    torch.testing.assert_close(loss, expected)
    stats = fixmatch.stats.compute()
    assert stats["above_threshold"] == pytest.approx(2 / 3)
    assert stats["shares"].tolist() == [0.5, 0.0, 0.5]
    everyone = FixMatch(SingleLabel(CLASSES), threshold=0.3, weight=1.0)
    _, loss_all = everyone.step(identity, labeled, (weak, strong))
    torch.testing.assert_close(loss_all, ce(strong, torch.tensor([0, 0, 2])))


def test_the_unlabeled_stream_deals_each_image_to_one_rank_per_epoch():
    shares = {}
    for rank in range(2):
        sampler = UnlabeledSampler(11, draws=8, seed=3, num_replicas=2, rank=rank)
        sampler.set_epoch(4)
        shares[rank] = [i for i, _ in sampler]
        assert len(shares[rank]) == len(sampler) == 8
    assert set(shares[0]).isdisjoint(shares[1]) and set(shares[0]) | set(shares[1]) == set(range(11))
    again = UnlabeledSampler(11, draws=8, seed=3, num_replicas=2, rank=0)
    again.set_epoch(4)
    assert [i for i, _ in again] == shares[0]  # (seed, epoch) alone decide the draw
    again.set_epoch(5)
    assert [i for i, _ in again] != shares[0]
    with pytest.raises(ConfigError, match="1 unlabeled image"):
        UnlabeledSampler(1, draws=4, num_replicas=2)


def test_unlabeled_batches_follow_the_labeled_ones_with_two_views_each(tiny_data, unlabeled_dir):
    dm = FolderDataModule(str(tiny_data), batch_size=8, num_workers=0, preprocessing={"image_size": 32},
                          unlabeled=Unlabeled(images=str(unlabeled_dir), ratio=3))
    dm.setup("fit")
    loaders = dm.train_dataloader()
    assert set(loaders) == {"labeled", "unlabeled"}
    assert len(loaders["unlabeled"]) == len(loaders["labeled"]) == 5  # 40 images / 8
    assert loaders["unlabeled"].batch_size == 24  # ratio x data.batch_size
    (weak, strong), label = next(iter(loaders["unlabeled"]))
    assert weak.shape == strong.shape and weak.shape[1:] == (3, 32, 32) and set(label.tolist()) == {-1}
    assert len(weak) >= 23  # 24, less broken.png if the draw put it here
    # with more unlabeled batches than labeled ones, the epoch is one pass over the unlabeled
    # images and the labeled ones are cycled: 41 / 8 = 6 steps against 40 / 8 = 5
    dm = FolderDataModule(str(tiny_data), batch_size=8, num_workers=0, preprocessing={"image_size": 32},
                          unlabeled=Unlabeled(images=str(unlabeled_dir), ratio=1))
    dm.setup("fit")
    loaders = dm.train_dataloader()
    assert len(loaders["unlabeled"]) == len(loaders["labeled"]) == 6
    assert {i for i, _ in loaders["unlabeled"].sampler} == set(range(41))
    assert len(list(loaders["labeled"].sampler)) == 48
    assert not torch.equal(weak, strong)


def test_a_semi_supervised_fit_logs_pseudo_labels_and_counts_a_bad_unlabeled_image(
        tiny_data, unlabeled_dir, tmp_path, caplog):
    caplog.set_level("INFO")
    args = fit_args(tiny_data, "--trainer.limit_val_batches=1", f"--data.unlabeled.images={unlabeled_dir}",
                    "--data.unlabeled.ratio=1", "--data.unlabeled.threshold=0.01")
    assert cli(["fit", *args], tmp_path) == 0
    assert f"Unlabeled: 41 images from {unlabeled_dir}; fixmatch with 1 per labeled image, threshold 0.01" \
        in caplog.text
    run = only_run(tmp_path / "logs")
    s = scalars(run)
    # over 5 classes the top softmax is at least 0.2: a threshold of 0.01 takes every image
    assert [v for _, v in s["train/unlabeled_above_threshold"]] == [1.0, 1.0]
    shares = [s[f"train/pseudo_labels/{c}"][-1][1] for c in ("checker", "circle", "cross", "dots", "square")
              if f"train/pseudo_labels/{c}" in s]
    assert len(shares) == 5 and sum(shares) == pytest.approx(1.0)
    assert len(s["train/unlabeled_loss"]) == 12  # every step: 41 unlabeled images at 8 a step, 6 an epoch
    assert s["train/skipped_images"][-1][1] == 1.0  # broken.png, counted like a labeled one


def _table(tiny_data: Path, out: Path, unlabeled: int) -> Path:
    """tiny_data's training images in a labels table, the first ``unlabeled`` with an empty label."""
    images = sorted((tiny_data / "train").rglob("*.png"))
    rows = [(str(p.relative_to(tiny_data)), p.parent.name) for p in images]
    with open(out, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["image", "label"])
        writer.writerows((image, "" if i < unlabeled else label) for i, (image, label) in enumerate(rows))
    return out


def test_rows_with_an_empty_label_are_the_unlabeled_images_when_the_table_says_so(tiny_data, tmp_path):
    table = _table(tiny_data, tmp_path / "labels.csv", unlabeled=6)
    dm = FolderDataModule(str(tiny_data), labels=str(table), unlabeled=Unlabeled(images=str(table)))
    assert len(dm.unlabeled_samples) == 6 and {s.label for s in dm.unlabeled_samples} == {-1}
    listed = {s.path for split in (dm.splits.train, dm.splits.val, dm.splits.test) for s in split}
    assert listed.isdisjoint(s.path for s in dm.unlabeled_samples) and len(listed) == 40 - 6
    assert dm.unlabeled_objective == {"method": "fixmatch", "threshold": 0.95, "weight": 1.0}
    with pytest.raises(DataFolderError, match="empty label for .*data.unlabeled.images="):
        FolderDataModule(str(tiny_data), labels=str(table)).splits  # noqa: B018


@pytest.mark.parametrize(("setting", "message"), [
    ("--data.unlabeled.images={missing}", "data.unlabeled.images must be a folder|does not exist"),
    ("--data.unlabeled.ratio=0", "data.unlabeled.ratio must be an integer >= 1"),
    ("--data.unlabeled.threshold=1.5", "data.unlabeled.threshold must be in (0, 1]"),
    ("--data.unlabeled.method=mixmatch", "data.unlabeled.method 'mixmatch' is not known; choose from fix"),
])
def test_a_bad_unlabeled_setting_fails_in_one_line_and_no_run(setting, message, tiny_data, unlabeled_dir,
                                                               tmp_path, capsys):
    args = fit_args(tiny_data, f"--data.unlabeled.images={unlabeled_dir}",
                    setting.format(missing=tmp_path / "nowhere"), epochs=1)
    assert cli(["fit", *args], tmp_path) != 0
    error = one_error(capsys.readouterr().err)
    assert any(m in error for m in message.split("|")), error
    assert not (tmp_path / "logs").exists()


def test_a_multi_label_task_refuses_unlabeled_images_in_one_line(multilabel_data, unlabeled_dir, tmp_path,
                                                                 capsys):
    args = fit_args(multilabel_data, f"--data.labels={multilabel_data / 'labels.csv'}",
                    f"--data.unlabeled.images={unlabeled_dir}", epochs=1)
    assert cli(["fit", *args], tmp_path) != 0
    assert "a multilabel task does not learn from unlabeled images" in one_error(capsys.readouterr().err)


@pytest.mark.slow
def test_a_semi_supervised_run_resumes_bit_exactly_at_an_epoch_boundary(tiny_data, unlabeled_dir, tmp_path):
    """Two epochs straight, and one then a resume: the unlabeled stream's draws and views come
    from (seed, epoch) alone, so the weights (raw and EMA) agree to the bit."""
    common = ["--trainer.deterministic=true", "--trainer.limit_train_batches=3", f"--config={EMA_PRESET}",
              *EVERY_EPOCH,
              f"--data.unlabeled.images={unlabeled_dir}", "--data.unlabeled.ratio=2",
              "--data.unlabeled.threshold=0.3"]
    a, b, run_a, run_b = straight_and_resumed(fit_args(tiny_data, *common, epochs=2), tmp_path)
    for state in ("state_dict", "current_model_state"):
        for key, tensor in a[state].items():
            assert torch.equal(tensor, b[state][key]), (state, key)
    above = scalars(run_a)["train/unlabeled_above_threshold"]
    assert above[-1] == scalars(run_b)["train/unlabeled_above_threshold"][-1] and above[-1][1] > 0


def test_data_unlabeled_dir_is_short_for_its_images(tiny_data, unlabeled_dir, tmp_path):
    """``--data.unlabeled=DIR``, the shorthand a user tries first, as ``model.input: 224`` is for
    the size: the folder's images train as unlabeled ones, with the other settings' defaults, and a
    ``--data.unlabeled.*`` beside it, before or after, changes that setting alone (jsonargparse by
    itself replaced the folder, or the setting, with the group's default)."""
    from project.cli import ProjectCLI

    for args in ([f"--data.unlabeled={unlabeled_dir}", "--data.unlabeled.ratio=2"],
                 ["--data.unlabeled.ratio=2", "--data.unlabeled", str(unlabeled_dir)]):
        cli_ = ProjectCLI(args=fit_args(tiny_data, *QUICK, *args, epochs=1), run=False)
        assert (cli_.datamodule.unlabeled.images, cli_.datamodule.unlabeled.ratio) == (str(unlabeled_dir), 2)
    config = tmp_path / "mine.yaml"  # the one-word form in a file, with a setting of the group given
    config.write_text(f"data:\n  unlabeled: {unlabeled_dir}\n")
    with pytest.raises(ConfigError, match=f"write `unlabeled: {{images: {unlabeled_dir}}}` there"):
        ProjectCLI(args=fit_args(tiny_data, f"--config={config}", "--data.unlabeled.ratio=2"), run=False)


@pytest.mark.slow
def test_a_run_with_unlabeled_images_evaluates_once_they_are_gone(tiny_data, unlabeled_dir, tmp_path):
    """The shorthand trains with the group's defaults; what comes after training (evaluate,
    calibrate) knows nothing of the unlabeled images, so their folder may go."""
    folder = shutil.copytree(unlabeled_dir, tmp_path / "unlabeled")
    assert cli(["fit", *fit_args(tiny_data, *QUICK, f"--data.unlabeled={folder}", epochs=1)], tmp_path) == 0
    run = only_run(tmp_path / "logs")
    assert "train/unlabeled_loss" in scalars(run)
    ckpt = next((run / "checkpoints").glob("best*.ckpt"))
    stored = read_checkpoint(ckpt)["datamodule_hyper_parameters"]
    assert stored["unlabeled"]["images"] == str(folder) and stored["unlabeled"]["ratio"] == 7
    shutil.rmtree(folder)  # what comes after training knows nothing of the unlabeled images
    assert cli(["evaluate", str(ckpt)], tmp_path) == 0
    assert cli(["calibrate", "--ckpt_path", str(ckpt)], tmp_path) == 0


def test_labeled_images_in_the_unlabeled_folder_are_left_out(tiny_data, unlabeled_dir, tmp_path, caplog):
    """An unlabeled folder above the data set (photos/ holding labeled/ and new/): its labeled
    images, validation and test ones too, would train on their own pseudo-labels and inflate the
    scores. They are left out, with a notice; a folder of labeled images alone is refused."""
    root = tmp_path / "photos"
    shutil.copytree(tiny_data / "train", root / "labeled")  # 5 classes, split 70/15/15 for the run
    shutil.copytree(unlabeled_dir, root / "new")
    caplog.set_level("INFO")

    def unlabeled(images: Path) -> list[str]:
        dm = FolderDataModule(str(root / "labeled"), num_workers=0, preprocessing={"image_size": 32},
                              unlabeled=Unlabeled(images=str(images)))
        return [Path(s.path).parent.name for s in dm.unlabeled_samples]

    assert unlabeled(root) == ["new"] * 41
    assert "Notice: 40 images in data.unlabeled.images are the data set's labeled ones" in caplog.text
    with pytest.raises(ConfigError, match="data.unlabeled.images .*holds only the data set's labeled images"):
        unlabeled(root / "labeled")
    (tmp_path / "linked").mkdir()  # the labeled images through a link: the same files
    (tmp_path / "linked" / "photos").symlink_to(root / "labeled")
    with pytest.raises(ConfigError, match="holds only the data set's labeled images"):
        unlabeled(tmp_path / "linked")
