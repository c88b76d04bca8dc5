"""The fine-tuning recipe from the config: each option changes what it should."""

from __future__ import annotations

import pytest
import torch
import torchvision

from project.checkpoints import load_model
from project.data.transforms import Augmentation, Preprocessing, train_transforms
from project.errors import ConfigError
from project.model import ImageClassifier, backbones
from project.model.recipe import batch_mixing, check_tta
from tests.conftest import best_ckpt, fit_args, only_run, run_cli


def _left_bright(size: int = 32) -> torch.Tensor:
    image = torch.zeros(3, size, size, dtype=torch.uint8)
    image[:, :, : size // 2] = 255
    return image


def _flipped(x: torch.Tensor) -> bool:
    half = x.shape[-1] // 2
    return bool(x[..., half:].mean() > x[..., :half].mean())


@pytest.mark.parametrize(("hflip", "expected"), [(0.0, {False}), (1.0, {True}), (0.5, {False, True})])
def test_hflip_probability_is_obeyed(hflip, expected):
    aug = Augmentation(hflip=hflip, crop_scale=(1.0, 1.0), color_jitter=0.0)
    transform = train_transforms(Preprocessing(32), aug)
    seen = set()
    for seed in range(40):
        torch.manual_seed(seed)
        seen.add(_flipped(transform(_left_bright())))
    assert seen == expected


def test_auto_augment_and_random_erasing_change_the_images():
    base = train_transforms(Preprocessing(32), Augmentation(hflip=0, crop_scale=(1, 1), color_jitter=0))
    for aug in (Augmentation(hflip=0, crop_scale=(1, 1), color_jitter=0, auto_augment="trivialaugment"),
                Augmentation(hflip=0, crop_scale=(1, 1), color_jitter=0, random_erasing=1.0)):
        transform = train_transforms(Preprocessing(32), aug)
        image = torch.randint(0, 255, (3, 40, 40), dtype=torch.uint8)
        differs = 0
        for seed in range(10):
            torch.manual_seed(seed)
            a = transform(image)
            torch.manual_seed(seed)
            differs += not torch.equal(a, base(image))
        assert differs >= 5, aug


def test_mixup_and_cutmix_make_soft_targets_that_sum_to_one():
    mix = batch_mixing(4, mixup_alpha=0.4, cutmix_alpha=1.0)
    x, y = torch.rand(16, 3, 8, 8), torch.arange(16) % 4
    torch.manual_seed(0)
    mixed, target = mix(x, y)
    assert target.shape == (16, 4) and mixed.shape == x.shape
    torch.testing.assert_close(target.sum(1), torch.ones(16))
    assert (target.max(1).values < 1).any()  # really mixed, not one-hot
    assert batch_mixing(4, 0.0, 0.0) is None


def test_preprocessing_comes_from_the_pretrained_weights():
    model = ImageClassifier(num_classes=3, backbone="efficientnet_b0", weights=None)
    assert model.hparams.interpolation == "bilinear"  # random weights: ImageNet's convention
    pre = backbones.weights_preprocessing("efficientnet_b0", "DEFAULT")
    assert pre["interpolation"] == "bicubic" and pre["crop_ratio"] == pytest.approx(224 / 256)
    pre = backbones.weights_preprocessing("resnet50", "IMAGENET1K_V2")
    assert pre["crop_ratio"] == pytest.approx(224 / 232)


def test_a_template_checkpoint_with_other_classes_works_as_weights(trained_run, caplog):
    ckpt = best_ckpt(trained_run)
    source = load_model(ckpt)
    model = ImageClassifier(num_classes=5, weights=str(ckpt))
    assert model.pretrained and model.head_lr_mult == 10.0
    assert model.net.fc.out_features == 5
    assert torch.equal(model.net.layer4[1].conv2.weight, source.net.layer4[1].conv2.weight)
    assert "dropped fc.bias, fc.weight" in model.weights_note


def test_a_weights_file_that_fits_nothing_fails_naming_the_keys(tmp_path):
    torch.save(torchvision.models.resnet18().state_dict(), tmp_path / "resnet18.pth")
    message = r"does not fit efficientnet_b0: \d+ of its layers .*features"
    with pytest.raises(backbones.WeightsError, match=message):
        ImageClassifier(num_classes=3, backbone="efficientnet_b0",
                        weights=str(tmp_path / "resnet18.pth"))


def test_tta_hflip_is_refused_for_a_model_trained_without_flips():
    with pytest.raises(ConfigError, match="trained without horizontal flips"):
        check_tta("hflip", 0.0)
    check_tta("hflip", 0.5)


def test_ema_weights_are_what_the_checkpoint_evaluates(tiny_data, tmp_path):
    result = run_cli(["fit", *fit_args(tiny_data, epochs=2)], cwd=tmp_path)  # EMA is in train.yaml
    assert result.returncode == 0, result.stderr[-3000:]
    run = only_run(tmp_path / "logs")
    ckpt = torch.load(best_ckpt(run), weights_only=True)
    raw, ema = ckpt["current_model_state"], ckpt["state_dict"]
    assert not torch.equal(raw["net.fc.weight"], ema["net.fc.weight"])
    model = load_model(best_ckpt(run))
    assert torch.equal(model.net.fc.weight, ema["net.fc.weight"])  # evaluate/predict/export use EMA

    evaluated = run_cli(["evaluate", str(best_ckpt(run)), "--tta", "hflip"], cwd=tmp_path)
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    assert "Test-time augmentation (hflip): accuracy" in evaluated.stdout
