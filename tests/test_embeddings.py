"""Embeddings once (project/extras/embeddings/): the cache computes each image once per network, and
probe, suspects, check-data and suggest read it."""

from __future__ import annotations

import csv
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from project.extras.embeddings import cache as cache_module
from tests.conftest import best_ckpt, cli, one_error


@pytest.fixture
def data(tiny_data, tmp_path) -> Path:
    """A copy of tiny_data that a test may change."""
    return Path(shutil.copytree(tiny_data, tmp_path / "data"))


def forwarded() -> int:
    return cache_module.FORWARDED


def embed(data: Path, run: Path, cwd: Path, *extra: str) -> int:
    return cli(["embed", str(data), "--ckpt_path", str(best_ckpt(run)), "--cache", str(cwd / "cache"),
                *extra], cwd)


def test_a_second_embed_computes_nothing_and_a_changed_file_alone_is_embedded_again(
        data, trained_run, tmp_path, capsys):
    images = sorted(data.rglob("*.png"))
    before = forwarded()
    assert embed(data, trained_run, tmp_path) == 0
    assert forwarded() - before == len(images)
    assert f"{len(images)} computed" in capsys.readouterr().out
    before = forwarded()
    assert embed(data, trained_run, tmp_path) == 0
    assert forwarded() == before
    assert f"0 computed, {len(images)} from the cache" in capsys.readouterr().out
    changed = images[3]
    Image.open(changed).convert("RGB").rotate(90).save(changed)
    before = forwarded()
    assert embed(data, trained_run, tmp_path) == 0
    assert forwarded() - before == 1
    shutil.move(images[5], images[5].with_name("renamed.png"))  # the same bytes under another name
    before = forwarded()
    assert embed(data, trained_run, tmp_path) == 0
    assert forwarded() == before


def test_a_cache_of_another_network_is_not_reused(data, trained_run, tmp_path, capsys):
    assert embed(data, trained_run, tmp_path) == 0
    capsys.readouterr()
    before = forwarded()
    other = tmp_path / "other.ckpt"  # the run's weights changed by a step (last.ckpt may be the best)
    checkpoint = torch.load(best_ckpt(trained_run), map_location="cpu", weights_only=False)
    first = next(iter(checkpoint["state_dict"]))
    checkpoint["state_dict"][first] = checkpoint["state_dict"][first] + 1e-3
    torch.save(checkpoint, other)
    assert cli(["embed", str(data), "--ckpt_path", str(other), "--cache", str(tmp_path / "cache")],
               tmp_path) == 0
    assert forwarded() - before == len(list(data.rglob("*.png")))
    assert "another network" in capsys.readouterr().err
    assert len(list((tmp_path / "cache").glob("*/meta.json"))) == 2


def test_a_cache_folder_whose_meta_names_another_network_is_rebuilt(data, trained_run, tmp_path, capsys):
    assert embed(data, trained_run, tmp_path) == 0
    meta = next((tmp_path / "cache").glob("*/meta.json"))
    meta.write_text(meta.read_text().replace("checkpoint sha256", "checkpoint sha256 0"))
    capsys.readouterr()
    before = forwarded()
    assert embed(data, trained_run, tmp_path) == 0
    assert forwarded() - before == len(list(data.rglob("*.png")))
    assert "rebuilt" in capsys.readouterr().err


def test_an_unreadable_image_is_skipped_and_counted_once(data, trained_run, tmp_path, capsys):
    (data / "train" / "circle" / "broken.png").write_bytes(b"not a png")
    assert embed(data, trained_run, tmp_path) == 0
    assert "1 skipped" in capsys.readouterr().out
    before = forwarded()
    assert embed(data, trained_run, tmp_path) == 0
    out = capsys.readouterr().out
    assert forwarded() == before and "1 skipped" in out and "0 computed" in out


def test_an_interrupted_embed_leaves_nothing_a_later_run_reads(data, trained_run, tmp_path, monkeypatch):
    def interrupted(*_args, **_kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(cache_module.np, "savez", interrupted)
    with pytest.raises(KeyboardInterrupt):
        embed(data, trained_run, tmp_path)
    monkeypatch.undo()
    folder = next((tmp_path / "cache").iterdir())
    assert not list(folder.glob("*.npz")) and not list(folder.glob(".*"))
    before = forwarded()
    assert embed(data, trained_run, tmp_path) == 0
    assert forwarded() - before == len(list(data.rglob("*.png")))


def test_probe_prints_the_accuracies_beside_the_fine_tuned_model_and_embeds_nothing_twice(
        trained_run, tmp_path, capsys):
    args = ["probe", "--ckpt_path", str(trained_run), "--cache", str(tmp_path / "cache"),
            "--out", str(tmp_path / "probe")]
    assert cli(args, tmp_path) == 0
    out = capsys.readouterr().out
    assert "val acc: " in out and "test acc: " in out and "fine-tuned model: " in out
    import json

    scores = json.loads((tmp_path / "probe" / "probe.json").read_text())
    assert scores["train_images"] == 40 and scores["test_images"] == 20
    assert 0 <= scores["test_acc_probe"] <= 1 and 0 <= scores["test_acc_finetuned"] <= 1
    before = forwarded()
    assert cli(args, tmp_path) == 0
    assert forwarded() == before


def plant_copies(data: Path) -> list[tuple[str, str]]:
    """A resized, a cropped and a re-encoded (JPEG) copy of three test images, put in train/ under
    new names: (original, copy) as the data folder names them."""
    planted = []
    for k, (original, change) in enumerate(zip(sorted((data / "test").rglob("*.png"))[::7][:3],
                                               ("resized", "cropped", "jpeg"), strict=True)):
        image = Image.open(original).convert("RGB")
        w, h = image.size
        copy = {"resized": image.resize((2 * w, 2 * h), Image.BICUBIC),
                "cropped": image.crop((1, 1, w - 1, h - 1)), "jpeg": image}[change]
        target = data / "train" / original.parent.name / f"reupload{k}.{'jpg' if change == 'jpeg' else 'png'}"
        copy.save(target, **({"quality": 90} if change == "jpeg" else {}))
        planted.append((original.relative_to(data).as_posix(), target.relative_to(data).as_posix()))
    return planted


@pytest.mark.slow  # six scans of the data; the fast tier checks check-data with a network below
def test_check_data_finds_resized_cropped_and_reencoded_copies_across_splits(data, trained_run, tmp_path,
                                                                           capsys):
    planted = plant_copies(data)
    args = ["check-data", str(data), "--ckpt_path", str(trained_run), "--cache", str(tmp_path / "cache"),
            "--out", str(tmp_path / "out"), "--drop-leaks"]
    assert cli(args, tmp_path) == 0
    out = capsys.readouterr().out
    assert "NEAR-DUPLICATES" in out and "least like their class" in out and "classes most alike" in out
    with open(tmp_path / "out" / "near_duplicates.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    found = {frozenset((r["image_a"], r["image_b"])): r for r in rows}
    for original, copy in planted:
        pair = found[frozenset((original, copy))]
        assert {pair["split_a"], pair["split_b"]} == {"train", "test"}
    leaks = [frozenset((r["image_a"], r["image_b"])) for r in rows if r["split_a"] != r["split_b"]]
    assert set(leaks[:len(planted)]) == {frozenset(p) for p in planted}  # the closest of all
    assert (tmp_path / "out" / "near_duplicates.png").stat().st_size > 0
    with open(tmp_path / "out" / "labels_without_leaks.csv", newline="") as f:
        kept = {r["image"] for r in csv.DictReader(f)}
    assert not kept & {copy for _, copy in planted} and {original for original, _ in planted} <= kept
    assert len(list((tmp_path / "out").glob("outliers.csv"))) == 1
    before = forwarded()
    assert cli(args, tmp_path) == 0
    assert forwarded() == before
    assert leak_pairs(tmp_path / "out") == {frozenset(p) for p in planted}  # look-alikes are not copies
    assert cli([*args, "--near", "0.5", "--pixels", "0"], tmp_path) == 0  # every pair above --near
    assert len(leak_pairs(tmp_path / "out")) > len(planted)
    assert cli([a for a in args if a != "--drop-leaks"], tmp_path) == 0
    assert (tmp_path / "out" / "labels_without_leaks.csv").is_file()  # a table to train with: kept
    capsys.readouterr()
    assert cli([*args, "--near", "1.5"], tmp_path) == 2
    captured = capsys.readouterr()
    assert "--near must be" in one_error(captured.err) and "Summary:" not in captured.out  # before the scan


@pytest.mark.slow
def test_check_data_splits_one_folder_as_training_does(data, trained_run, tmp_path, capsys):
    """Without split folders every image was counted as train, so no copy was ever a leak: the
    splits are training's seeded ones (the run's split settings), leaks and --drop-leaks too."""
    from project.data.folders import discover

    flat = tmp_path / "flat"
    for image in sorted(data.rglob("*.png")):
        (flat / image.parent.name).mkdir(parents=True, exist_ok=True)
        shutil.copy(image, flat / image.parent.name / f"{image.parent.parent.name}-{image.name}")
    for k, image in enumerate(sorted(flat.rglob("*.png"))[::9]):  # re-uploads beside their originals
        Image.open(image).convert("RGB").save(image.parent / f"copy{k}.jpg", quality=90)
    splits = discover(flat)
    split_of = {Path(s.path).relative_to(flat).as_posix(): name for name in ("train", "val", "test")
                for s in getattr(splits, name)}
    assert cli(["check-data", str(flat), "--ckpt_path", str(trained_run), "--cache", str(tmp_path / "cache"),
                "--out", str(tmp_path / "out"), "--drop-leaks"], tmp_path) == 0
    with open(tmp_path / "out" / "near_duplicates.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert rows and all((r["split_a"], r["split_b"]) == (split_of[r["image_a"]], split_of[r["image_b"]])
                        for r in rows)
    assert leak_pairs(tmp_path / "out")  # some copy drew another split than its original
    with open(tmp_path / "out" / "labels_without_leaks.csv", newline="") as f:
        kept = list(csv.DictReader(f))
    assert {r["split"] for r in kept} == {"train", "val", "test"}
    assert all(r["split"] == split_of[r["image"]] for r in kept)

    shutil.rmtree(data / "val" / sorted(p.name for p in (data / "val").iterdir())[0])  # splits cannot be made
    capsys.readouterr()
    assert cli(["check-data", str(data), "--ckpt_path", str(trained_run), "--cache", str(tmp_path / "cache"),
                "--out", str(tmp_path / "out2")], tmp_path) == 1
    out = capsys.readouterr().out
    assert "NEAR-DUPLICATES" in out and "(splits as the data states them: the classes of" in out


def test_stated_splits_leave_rows_without_a_label_out_of_the_classes(tiny_data, tmp_path):
    """A table whose empty-label rows are FixMatch's unlabeled images cannot be split as training
    does (its empty labels are problems without data.unlabeled): the stated splits hold the
    labeled rows, never a class named None."""
    from project.extras.embeddings.check import stated_splits

    images = sorted((tiny_data / "train").rglob("*.png"))[:4]
    table = tmp_path / "labels.csv"
    rows = [f"{p.relative_to(tiny_data).as_posix()},{p.parent.name if k else ''}"
            for k, p in enumerate(images)]
    table.write_text("image,label\n" + "".join(f"{r}\n" for r in rows))  # the first: no label
    stated = stated_splits(str(tiny_data), str(table))
    assert [cls for _, cls, _ in stated] == [p.parent.name for p in images[1:]]


def test_a_configs_split_seed_splits_the_images_it_names(tiny_data, tmp_path):
    from project.data.folders import discover
    from project.extras.embeddings.sources import labeled_splits

    flat = Path(shutil.copytree(tiny_data / "train", tmp_path / "flat"))
    config = tmp_path / "c.yaml"
    config.write_text("data:\n  split_seed: 7\n  seed: 3\n  val_fraction: 0.3\n")  # seed: the draws'
    paths = [[s.path for s in getattr(splits, name)] for name in ("train", "val", "test")
             for splits in (labeled_splits(None, None, str(flat), config=str(config)),
                            discover(flat, 0.3, 0.15, seed=7))]
    assert paths[0::2] == paths[1::2] and paths[0] != [s.path for s in discover(flat, 0.3).train]


def leak_pairs(out: Path) -> set[frozenset[str]]:
    """The pairs across splits of check-data's near_duplicates.csv."""
    with open(out / "near_duplicates.csv", newline="") as f:
        return {frozenset((r["image_a"], r["image_b"])) for r in csv.DictReader(f)
                if r["split_a"] != r["split_b"]}


def test_pixel_agreement_tells_a_reupload_from_a_look_alike(tmp_path):
    from project.extras.embeddings.check import PIXELS
    from project.extras.embeddings.copies import agreement

    rng = np.random.default_rng(0)
    base = (rng.random((8, 8)) * 255).astype(np.uint8)
    original = Image.fromarray(base).resize((64, 64), Image.BICUBIC)
    nudged = np.clip(base.astype(int) + rng.integers(-60, 60, (8, 8)), 0, 255)
    other = Image.fromarray(nudged.astype(np.uint8))
    files = {"original.png": original, "resized.png": original.resize((96, 96), Image.BICUBIC),
             "cropped.png": original.crop((3, 1, 62, 63)), "copy.jpg": original,
             "alike.png": other.resize((64, 64), Image.BICUBIC)}
    for name, image in files.items():
        image.convert("RGB").save(tmp_path / name, **({"quality": 70} if name.endswith(".jpg") else {}))
    scores = agreement([(str(tmp_path / "original.png"), str(tmp_path / n)) for n in list(files)[1:]])
    assert (scores[:3] >= PIXELS).all() and scores[3] < PIXELS, scores
    assert agreement([(str(tmp_path / "original.png"), str(tmp_path / "missing.png"))])[0] == 0


def test_check_data_without_a_network_or_run_is_as_before(tiny_data, tmp_path, capsys):
    assert cli(["check-data", str(tiny_data)], tmp_path) == 0
    assert "NEAR-DUPLICATES" not in capsys.readouterr().out
    assert not (tmp_path / "logs").exists()


@pytest.fixture
def colours(tmp_path) -> tuple[Path, list[str]]:
    """Three classes of noisy images that any network tells apart (red, green, blue), 12 training
    images each, of which three are filed under a wrong class: (folder, the wrongly filed paths)."""
    import numpy as np

    rng = np.random.default_rng(0)
    root = tmp_path / "colours"
    wrong = []
    for split, count in (("train", 12), ("val", 3)):
        for name in ("blue", "green", "red"):
            (root / split / name).mkdir(parents=True)
        for c, name in enumerate(("blue", "green", "red")):
            for k in range(count):
                pixels = rng.integers(0, 90, (32, 32, 3))
                pixels[..., 2 - c] += 160
                folder = name
                if split == "train" and k == 0:  # planted: a red image filed as green, ...
                    folder = ("green", "red", "blue")[c]
                path = root / split / folder / f"{name}{k}.png"
                Image.fromarray(pixels.astype("uint8")).save(path)
                if folder != name:
                    wrong.append(str(path))
    return root, wrong


def test_suspects_by_embeddings_ranks_planted_wrong_labels_first_and_embeds_once(
        colours, trained_run, tmp_path, capsys):
    data, wrong = colours
    args = ["suspects", "--ckpt_path", str(trained_run), "--data_dir", str(data), "--folds", "3",
            "--cache", str(tmp_path / "cache"), "--out", str(tmp_path / "suspects")]
    assert cli(args, tmp_path) == 0
    assert "linear model on embeddings" in capsys.readouterr().out
    with open(tmp_path / "suspects" / "suspects.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 36
    assert {r["path"] for r in rows[:len(wrong)]} == set(wrong), rows[:5]
    assert (tmp_path / "suspects" / "suspects.png").stat().st_size > 0
    before = forwarded()
    assert cli(args, tmp_path) == 0
    assert forwarded() == before


def test_probe_scores_a_linear_classifier_on_separable_embeddings(colours, trained_run, tmp_path, capsys):
    data, _ = colours
    assert cli(["probe", "--ckpt_path", str(trained_run), "--data_dir", str(data), "--cache",
                str(tmp_path / "cache"), "--out", str(tmp_path / "probe")], tmp_path) == 0
    out = capsys.readouterr().out
    found = re.search(r"val acc: ([\d.]+) on 9 images\n", out)  # no fine-tuned figure: other classes
    assert found and float(found.group(1)) >= 7 / 9, out  # the colours separate


def test_probe_fits_a_multilabel_table_with_the_tasks_loss_and_score(multilabel_data, trained_run, tmp_path):
    import json

    assert cli(["probe", "--ckpt_path", str(trained_run), "--data_dir", str(multilabel_data), "--labels",
                str(multilabel_data / "labels.csv"), "--cache", str(tmp_path / "cache"), "--out",
                str(tmp_path / "probe")], tmp_path) == 0
    scores = json.loads((tmp_path / "probe" / "probe.json").read_text())
    assert scores["metric"] == "map" and 0.5 < scores["val_map_probe"] <= 1, scores  # BCE, mean AP


def test_suspects_refuses_another_tasks_labels_before_embedding_them(multilabel_data, trained_run, tmp_path,
                                                                      capsys):
    before = forwarded()
    assert cli(["suspects", "--ckpt_path", str(trained_run), "--data_dir", str(multilabel_data), "--labels",
                str(multilabel_data / "labels.csv"), "--cache", str(tmp_path / "cache")], tmp_path) == 2
    assert "made for one class per image" in one_error(capsys.readouterr().err)
    assert forwarded() == before and not (tmp_path / "cache").exists()
    assert cli(["suspects", "--method", "refit", "--ckpt_path", str(trained_run)], tmp_path) == 2
    assert "--ckpt_path is for --method embeddings" in one_error(capsys.readouterr().err)


def test_suggest_reads_and_fills_the_same_cache(tiny_data, trained_run, tmp_path, capsys):
    unlabeled = tmp_path / "unlabeled"
    unlabeled.mkdir()
    for k, image in enumerate(sorted((tiny_data / "test").rglob("*.png"))[:8]):
        shutil.copy(image, unlabeled / f"new{k}.png")
    cache = tmp_path / "cache"
    assert embed(unlabeled, trained_run, tmp_path) == 0  # `embed` first: suggest then computes
    args = ["suggest", "--unlabeled", str(unlabeled), "--n", "4", "--ckpt_path", str(trained_run),
            "--cache", str(cache), "--out", str(tmp_path / "suggest")]
    before = forwarded()
    assert cli(args, tmp_path) == 0
    assert forwarded() - before == 40  # the training images only (k-center keeps away from them)
    assert (tmp_path / "suggest" / "to_label.csv").read_text().count("\n") == 5  # header and 4 rows
    before = forwarded()
    assert cli(args, tmp_path) == 0
    assert forwarded() == before


def test_probe_of_other_classes_gives_no_fine_tuned_score(data, trained_run, tmp_path, capsys):
    """Data of as many classes under other names: the network's outputs are not its classes."""
    first = sorted(p.name for p in (data / "train").iterdir())[0]
    for split in ("train", "val", "test"):
        (data / split / first).rename(data / split / "zz")
    assert cli(["probe", "--ckpt_path", str(trained_run), "--data_dir", str(data), "--cache",
                str(tmp_path / "cache"), "--out", str(tmp_path)], tmp_path) == 0
    assert "fine-tuned" not in capsys.readouterr().out


def test_evaluate_shows_the_probe_beside_the_fine_tuned_model(trained_run, tmp_path):
    import shutil

    from tests.conftest import best_ckpt

    run = tmp_path / "run"
    shutil.copytree(trained_run, run)
    assert cli(["probe", "--ckpt_path", str(run), "--cache", str(tmp_path / "cache")], tmp_path) == 0
    assert (run / "probe.json").is_file()
    assert cli(["evaluate", str(run)], tmp_path) == 0
    report = (best_ckpt(run).parent / "report.md").read_text()
    assert "## Linear probe" in report and "| test | " in report.split("## Linear probe")[1]
    assert cli(["evaluate", str(run / "checkpoints/last.ckpt")], tmp_path) == 0  # the probe was of best
    assert "## Linear probe" not in (run / "checkpoints/report.md").read_text()


def test_a_configs_pretrained_network_embeds_for_probe_and_check_data(colours, tmp_path, capsys):
    """--config: the config's backbone with its weights file (here resnet18's tensors saved to a
    .pth), not a checkpoint: its new head is never read, and probe and check-data share its cache."""
    import torch
    from torchvision.models import resnet18

    data, _ = colours
    weights = tmp_path / "resnet18.pth"
    torch.save(resnet18().state_dict(), weights)
    config = tmp_path / "network.yaml"
    config.write_text(f"model:\n  backbone: resnet18\n  weights: {weights}\n  input:\n    size: 32\n")
    cache = str(tmp_path / "cache")
    assert cli(["probe", "--config", str(config), "--data_dir", str(data), "--cache", cache,
                "--out", str(tmp_path / "probe")], tmp_path) == 0
    assert "val acc: " in capsys.readouterr().out
    before = forwarded()
    assert cli(["check-data", str(data), "--config", str(config), "--cache", cache, "--out",
                str(tmp_path / "check")], tmp_path) == 0
    assert "NEAR-DUPLICATES" in capsys.readouterr().out
    assert forwarded() == before  # the same network: every image from the cache


def test_a_shard_is_read_once_not_once_per_image(tmp_path):
    """Every row of a shard is a view of one array read once: reading it per row kept a full copy
    alive per image (quadratic memory: 2,500 images of 1,280 values took 19 GB and were killed)."""
    import numpy as np

    rows = 50
    hashes = [f"{k:040x}" for k in range(rows)]
    features, logits = np.ones((rows, 8), np.float32), np.zeros((rows, 3), np.float32)
    cache_module.write_shard(tmp_path, hashes, features, logits, [])
    known, _, _ = cache_module.read_shards(tmp_path)
    assert len(known) == rows
    bases = {id(known[h][0].base) for h in hashes}
    assert len(bases) == 1, f"{len(bases)} copies of the shard's features for {rows} rows"


@pytest.mark.distributed
def test_embed_under_torchrun_gives_each_rank_a_share_of_the_images(data, trained_run, tmp_path):
    import subprocess
    import sys

    cache = tmp_path / "cache"
    result = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m", "project",
         "embed", str(data), "--ckpt_path", str(trained_run), "--cache", str(cache), "--device", "cpu"],
        cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.count("embedded") == 1, result.stdout  # rank 0 reports, once
    shards = [np.load(p)["hashes"] for p in cache.rglob("*.npz") if not p.name.startswith(".")]
    images = len(list(data.rglob("*.png")))
    assert len(shards) == 2 and sorted(map(len, shards)) == [images // 2, images - images // 2]
    before = forwarded()
    assert embed(data, trained_run, tmp_path) == 0  # the cache the two ranks filled is whole
    assert forwarded() == before
