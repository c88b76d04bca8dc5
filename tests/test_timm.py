"""timm backbones (``model.backbone: timm/<name>``): a training step per family, weights from the
Hugging Face cache, the offline fallback, preprocessing from pretrained_cfg, names, ONNX export."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch
from torch import nn

timm = pytest.importorskip("timm")
from safetensors.torch import save_file  # noqa: E402  (timm installs it)

from project.common.preprocessing import Input  # noqa: E402
from project.extras import timm_hub, zoo  # noqa: E402
from project.extras.deploy.exporters import export_onnx  # noqa: E402
from project.model import ImageClassifier, backbones  # noqa: E402

FAMILIES = [("timm/resnet10t", 32), ("timm/convnext_atto", 32), ("timm/mobilenetv3_small_050", 32),
            ("timm/efficientnet_b0", 32), ("timm/vit_tiny_patch16_224", 224)]


@pytest.fixture(autouse=True)
def hf_home(tmp_path, monkeypatch) -> Path:
    """An empty Hugging Face cache and no hub: nothing comes from a real cache or the network."""
    home = tmp_path / "hf_home"
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.delenv("HUGGINGFACE_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return home


def place_in_cache(home: Path, repo: str, state: dict, revision: str = "0123abcd") -> Path:
    """A weights file where ``huggingface_hub`` keeps downloads: snapshots/<hash>/ + refs/main."""
    root = home / "hub" / f"models--{repo.replace('/', '--')}"
    (root / "snapshots" / revision).mkdir(parents=True)
    (root / "refs").mkdir()
    (root / "refs" / "main").write_text(revision)
    path = root / "snapshots" / revision / "model.safetensors"
    save_file({k: v.contiguous() for k, v in state.items()}, str(path))
    return path


@pytest.mark.parametrize(("name", "size"), FAMILIES)
@pytest.mark.parametrize("kind", ["linear", "mlp"])
def test_each_family_trains_one_step_with_a_new_head(name, size, kind):
    torch.manual_seed(0)
    model = ImageClassifier(num_classes=3, backbone=name, weights=None, input=size,
                            head=backbones.Head(kind, 8))
    head = model.net.get_submodule(model.head_name)
    linears = [m for m in head.modules() if isinstance(m, nn.Linear)]
    assert len(linears) == (1 if kind == "linear" else 2) and linears[-1].out_features == 3
    groups = model.param_groups()
    assert sum(len(g["params"]) for g in groups) == len(list(model.parameters()))
    in_head = {id(p) for g in groups if g["name"].startswith("head") for p in g["params"]}
    assert in_head == {id(p) for p in head.parameters()}
    before = {n: p.detach().clone() for n, p in model.net.named_parameters()}
    optimizer = torch.optim.SGD(groups, lr=0.05, momentum=0.9)
    model.train()
    loss = model.loss(model(torch.randn(4, 3, size, size)), torch.tensor([0, 1, 2, 0]))
    loss.backward()
    optimizer.step()
    assert torch.isfinite(loss)
    moved = {n for n, p in model.net.named_parameters() if not torch.equal(p, before[n])}
    assert any(n.startswith(f"{model.head_name}.") for n in moved) and len(moved) > len(in_head)


@pytest.mark.parametrize(("arch", "repo", "size"), [
    ("convnext_atto", "timm/convnext_atto.d2_in1k", 64),
    ("vit_tiny_patch16_224", "timm/vit_tiny_patch16_224.augreg_in21k_ft_in1k", 224),
])
def test_pretrained_weights_come_from_the_hugging_face_cache(hf_home, arch, repo, size):
    torch.manual_seed(0)
    reference = timm.create_model(arch)  # the published layout: 1000 ImageNet classes
    place_in_cache(hf_home, repo, reference.state_dict())
    model = ImageClassifier(num_classes=3, backbone=f"timm/{arch}", weights="DEFAULT", input=size)
    assert model.pretrained and "from the cache" in model.weights_note
    own = model.net.state_dict()
    for key, tensor in reference.state_dict().items():
        if not key.startswith(f"{model.head_name}."):
            assert torch.equal(own[key], tensor), key
    head = model.net.get_submodule(model.head_name)
    assert head.out_features == 3 and not torch.equal(head.weight, reference.get_classifier().weight[:3])
    groups = {g["name"]: g for g in model.param_groups()}
    assert groups["head"]["lr"] == 10 * groups["backbone"]["lr"]


def test_a_vit_built_for_a_small_image_resamples_its_pretrained_position_embedding(hf_home):
    reference = timm.create_model("vit_tiny_patch16_224")
    place_in_cache(hf_home, "timm/vit_tiny_patch16_224.augreg_in21k_ft_in1k", reference.state_dict())
    built = backbones.build("timm/vit_tiny_patch16_224", "DEFAULT", 3, image_size=32)
    assert built.pretrained
    assert built.net.pos_embed.shape == (1, 1 + 2 * 2, 192)  # 32 px / 16 px patches: 2 x 2 + cls
    assert torch.equal(built.net.blocks[5].mlp.fc1.weight, reference.blocks[5].mlp.fc1.weight)
    assert built.net(torch.randn(2, 3, 32, 32)).shape == (2, 3)


@pytest.mark.parametrize("offline", ["HF_HUB_OFFLINE=1", "hub unreachable", "download fails"])
def test_offline_without_a_cache_warns_loudly_and_records_pretrained_false(offline, hf_home, monkeypatch,
                                                                           caplog):
    if offline != "HF_HUB_OFFLINE=1":
        monkeypatch.delenv("HF_HUB_OFFLINE")
        monkeypatch.setattr(timm_hub, "reachable", lambda url, timeout=0: offline == "download fails")

    def no_download(*args, **kwargs):
        if offline != "download fails":
            pytest.fail("a download was attempted although the hub is offline")
        raise OSError("connection reset")

    monkeypatch.setattr(timm_hub, "_pretrained", no_download)
    with caplog.at_level(logging.WARNING):
        model = ImageClassifier(num_classes=3, backbone="timm/convnext_atto", weights="DEFAULT",
                                input=32)
    assert not model.pretrained and "NO pretrained weights" in model.weights_note
    assert "PRETRAINED WEIGHTS NOT AVAILABLE" in caplog.text
    folder = hf_home / "hub" / "models--timm--convnext_atto.d2_in1k" / "snapshots"
    assert f"the file model.safetensors in the folder {folder}/<any>" in caplog.text


def test_weights_file_of_a_timm_model_or_a_template_checkpoint(tmp_path):
    source = timm.create_model("convnext_atto", num_classes=7)
    torch.save({"state_dict": {f"net.{k}": v for k, v in source.state_dict().items()}}, tmp_path / "run.ckpt")
    model = ImageClassifier(num_classes=3, backbone="timm/convnext_atto", weights=str(tmp_path / "run.ckpt"),
                            input=32)
    assert model.pretrained and "dropped the file's head head.fc.bias, head.fc.weight" in model.weights_note
    last = source.stages[3].blocks[1].conv_dw.weight
    assert torch.equal(model.net.stages[3].blocks[1].conv_dw.weight, last)
    save_file(timm.create_model("resnet10t").state_dict(), str(tmp_path / "resnet.safetensors"))
    with pytest.raises(backbones.WeightsError, match=r"does not fit timm/convnext_atto: \d+ of its layers"):
        ImageClassifier(num_classes=3, backbone="timm/convnext_atto",
                        weights=str(tmp_path / "resnet.safetensors"), input=32)


def test_preprocessing_comes_from_the_pretrained_cfg():
    pre = backbones.resolve_preprocessing("timm/convnext_nano.in12k_ft_in1k", "DEFAULT", 224)
    assert pre.crop_ratio == pytest.approx(0.95) and pre.interpolation == "bicubic"
    vit = backbones.resolve_preprocessing("timm/vit_small_patch16_224.augreg_in21k_ft_in1k", "DEFAULT", 224)
    assert vit.crop_ratio == pytest.approx(0.9) and vit.mean == vit.std == (0.5, 0.5, 0.5)
    assert backbones.resolve_preprocessing("timm/convnext_atto", "d2_in1k", 224).crop_ratio == 0.875
    assert backbones.resolve_preprocessing("timm/convnext_atto", None, 224).interpolation == "bilinear"
    given = Input(224, mean=[0.1, 0.2, 0.3])
    assert backbones.resolve_preprocessing("timm/convnext_atto", None, given).mean == (0.1, 0.2, 0.3)
    model = ImageClassifier(num_classes=3, backbone="timm/resnet18.a1_in1k", weights="DEFAULT", input=32)
    assert model.hparams.input["crop_ratio"] == pytest.approx(0.95)
    assert model.hparams.input["interpolation"] == "bicubic"


def test_unknown_names_and_tags_fail_with_the_close_ones():
    with pytest.raises(backbones.WeightsError, match="did you mean timm/convnext_atto"):
        ImageClassifier(num_classes=3, backbone="timm/convnext_atoo", weights=None)
    with pytest.raises(backbones.WeightsError, match=r"timm/resnet18\.a1_in1k"):
        backbones.build("timm/resnet18.in1k", None, 3)
    with pytest.raises(backbones.WeightsError, match="DEFAULT, d2_in1k"):
        backbones.resolve_preprocessing("timm/convnext_atto", "in22k", 224)
    with pytest.raises(backbones.WeightsError, match="or a timm model as timm/<name>"):
        backbones.build("convnext_atto", None, 3)


def test_models_lists_both_zoos(capsys):
    assert zoo.main(["resnet18"]) == 0
    names = capsys.readouterr().out.split()
    assert "resnet18" in names and "timm/resnet18" in names
    assert zoo.main(["timm/convnext_atto*", "--pretrained"]) == 0
    names = capsys.readouterr().out.split()
    assert "timm/convnext_atto.d2_in1k" in names and all(n.startswith("timm/") for n in names)


@pytest.mark.slow
@pytest.mark.parametrize(("name", "size"), [("timm/convnext_atto", 64), ("timm/vit_tiny_patch16_224", 224)])
def test_onnx_export_matches_pytorch(name, size, tmp_path):
    model = ImageClassifier(num_classes=3, backbone=name, weights=None, input=size).eval()
    assert export_onnx(model, model.net.float().eval(), tmp_path / "model.onnx") <= 1e-4
