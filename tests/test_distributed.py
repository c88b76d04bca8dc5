"""Scale-out on CPU: real 2-process DDP (gloo), the distributed sampler, LR scaling."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
import torch

from project.data.demo import make_demo
from project.data.samplers import EpochSampler
from project.tasks.single.task import inverse_frequency
from tests.conftest import REPO, cli, fit_args, only_run, run_cli, scalars

DDP = ["--trainer.accelerator=cpu", "--trainer.devices=2", "--trainer.strategy=ddp"]
ODD_PER_CLASS = 5  # x 3 classes: 15 val and 15 test images, which 2 ranks cannot split evenly


@pytest.fixture(scope="module")
def odd_data(tmp_path_factory) -> Path:
    """Like ``tiny_data`` but with an odd number of val and test images (15 = 8 + 7 on 2 ranks),
    so a sampler that pads the last rank with a repeat would count one image twice."""
    out = tmp_path_factory.mktemp("data") / "odd"
    return make_demo(out, train_per_class=8, val_per_class=ODD_PER_CLASS,
                     test_per_class=ODD_PER_CLASS, image_size=32, num_classes=3, seed=1)


def _shares(num_items: int, num_replicas: int, epoch: int, seed: int = 3) -> list[list[int]]:
    """The index list each rank draws (the augmentation seeds dropped)."""
    shares = []
    for rank in range(num_replicas):
        sampler = EpochSampler(num_items, seed=seed, num_replicas=num_replicas, rank=rank)
        sampler.set_epoch(epoch)
        draw = list(sampler)
        assert len(draw) == len(sampler)
        shares.append([i for i, _ in draw])
    return shares


@pytest.mark.parametrize("num_replicas", [2, 3])
def test_sampler_ranks_share_out_every_item_once_plus_padding(num_replicas):
    n = 13  # odd, and prime: no replica count above 1 divides it
    pad = -n % num_replicas  # 1 repeat for 2 ranks, 2 for 3 ranks
    for epoch in range(5):
        shares = _shares(n, num_replicas, epoch)
        assert {len(s) for s in shares} == {(n + pad) // num_replicas}  # equal lengths: no hang
        counts = Counter(i for share in shares for i in share)
        assert set(counts) == set(range(n))  # every item is drawn by some rank...
        repeats = [i for i, c in counts.items() if c > 1]
        assert len(repeats) == pad and all(counts[i] == 2 for i in repeats)  # ...once, but the pads
        for a in range(num_replicas):
            assert len(set(shares[a])) == len(shares[a])  # no rank sees an image twice
            for b in range(a + 1, num_replicas):
                assert set(shares[a]) & set(shares[b]) <= set(repeats)  # disjoint but for pads


def test_sampler_draw_depends_on_seed_and_epoch_only():
    def draw(seed: int, epoch: int, rank: int = 0) -> list[tuple[int, int]]:
        sampler = EpochSampler(13, seed=seed, num_replicas=2, rank=rank)
        sampler.set_epoch(epoch)
        return list(sampler)  # (index, augmentation seed) pairs

    assert draw(3, 4) == draw(3, 4)  # another object, same seed and epoch: the same draw
    assert draw(3, 4, rank=1) == draw(3, 4, rank=1)
    assert draw(3, 5) != draw(3, 4)  # the next epoch draws anew...
    assert draw(4, 4) != draw(3, 4)  # ...and so does another seed
    assert _shares(13, 2, epoch=4) != _shares(13, 2, epoch=5)
    # the order changes, not only the augmentation seeds
    assert [i for i, _ in draw(3, 5)] != [i for i, _ in draw(3, 4)]


def test_distributed_weighted_sampler_is_the_one_draw_split_and_balanced():
    targets = torch.tensor([0] * 80 + [1] * 20)
    weights = inverse_frequency(targets, 2)[targets]
    ranks = [EpochSampler(100, weights, seed=3, num_replicas=2, rank=r) for r in (0, 1)]
    single = EpochSampler(100, weights, seed=3)
    draws = []
    for epoch in range(30):
        for s in (*ranks, single):
            s.set_epoch(epoch)
        keys = [list(s) for s in ranks]
        assert len(keys[0]) == len(keys[1]) == 50
        # Drawn with replacement, so images can repeat; but the two shares are complementary
        # slices of the one draw a single process makes (interleaved, they are exactly it) and
        # no drawn position (with its own augmentation seed) is used by both ranks.
        union = [None] * 100
        union[0::2], union[1::2] = keys
        assert union == list(single)
        assert not {s for _, s in keys[0]} & {s for _, s in keys[1]}
        draws.append([i for i, _ in union])
    assert draws[0] != draws[1]
    share = Counter(int(targets[i]) for d in draws for i in d)[1] / (30 * 100)
    assert 0.45 < share < 0.55  # class-balanced despite 80/20 data


def _last_values(run: Path, prefix: str) -> dict[str, float]:
    return {tag: series[-1][1] for tag, series in scalars(run).items() if tag.startswith(prefix)}


@pytest.mark.distributed
def test_two_process_ddp_fit_validates_each_image_once_and_resumes(odd_data, tmp_path):
    """The ddp preset (make train-ddp) on two CPU processes; 32-bit so that the 1- and 2-process
    evaluations below differ only by float rounding."""
    args = fit_args(odd_data, "--config", str(REPO / "configs/presets/ddp.yaml"), *DDP,
                    "--data.batch_size=4", "--model.base_batch_size=4", "--trainer.precision=32-true",
                    epochs=1)
    result = run_cli(["fit", *args], cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-4000:]
    assert "sync_batchnorm turned off" in result.stderr  # SyncBatchNorm runs on GPUs only
    assert "SyncBatchNorm layers only work with GPU" not in result.stderr
    run = only_run(tmp_path / "logs")  # exactly one run folder...
    ckpts = sorted(p.name for p in (run / "checkpoints").iterdir())
    assert len(ckpts) == 2 and "last.ckpt" in ckpts  # ...and one set of checkpoints
    assert len(list(run.glob("events.out.tfevents*"))) == 1
    assert "Global batch 8 (4 per device x 2 devices" in result.stderr + result.stdout
    assert (result.stderr + result.stdout).count("First training batch") == 1  # not one per rank
    two = _last_values(run, "val/")
    assert len(scalars(run)["val/acc"]) == 1

    # The same checkpoint validated by one process over the same 15 images. The 2-process
    # numbers above are right only if each rank saw a disjoint share (8 + 7, no padding repeat)
    # and the metric states were summed across ranks before computing: a repeated image or
    # rank 0's share alone (8 images) changes accuracy and per-class recall/precision.
    ckpt = run / "checkpoints" / "last.ckpt"
    assert cli(["validate", "--config", str(run / "config.yaml"), f"--ckpt_path={ckpt}",
                "--trainer.devices=1", "--trainer.strategy=auto",
                f"--trainer.logger.init_args.save_dir={tmp_path / 'single'}"], tmp_path) == 0
    one = _last_values(next((tmp_path / "single").rglob("events.out.tfevents*")).parent, "val/")
    print("one process:", one, "two processes:", two)
    counted = [t for t in one
               if t == "val/acc" or t.startswith(("val/per_class/recall/", "val/per_class/precision/"))]
    assert len(counted) == 1 + 2 * 3
    for tag in counted:  # ratios of integer counts: equal exactly, or an image was miscounted
        assert two[tag] == one[tag], tag
    # The mean loss differs only by the order of float32 sums (per image and across ranks) and
    # by batch-size-dependent conv kernels: ~1e-7 relative. One image more or less moves it by
    # about |loss_i - mean| / 15, orders of magnitude more than 1e-5.
    assert two["val/loss"] == pytest.approx(one["val/loss"], abs=1e-5)

    # The count itself, from the synced confusion matrix of a 2-process evaluation (the test
    # split goes through the same unpadded sampler and synced metrics as validation).
    evaluated = run_cli(["evaluate", str(ckpt), *DDP, "--trainer.enable_progress_bar=false"],
                        cwd=tmp_path)
    assert evaluated.returncode == 0, evaluated.stderr[-4000:]
    report = json.loads((run / "checkpoints" / "report.json").read_text())
    assert sum(map(sum, report["confusion_matrix"])) == 3 * ODD_PER_CLASS
    assert [c["support"] for c in report["classes"].values()] == [ODD_PER_CLASS] * 3

    resumed = run_cli(["resume", "--trainer.max_epochs=2"], cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    assert only_run(tmp_path / "logs") == run
    ckpt = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)
    assert ckpt["epoch"] == 1 and ckpt["hyper_parameters"]["lr_scaling"] == "linear"


@pytest.mark.distributed
def test_one_and_two_processes_with_the_same_global_batch_agree(tiny_data, tmp_path):
    """Same seed and global batch (8 = 8 x 1 = 4 x 2): both runs see the same images with the
    same augmentation in the same global batches, and DDP averages the halves' gradients, so
    the runs are the same computation up to the order of float sums. The model is a small ViT
    (timm's test_vit at 64 px), whose LayerNorm and zero dropout make the halves independent:
    BatchNorm would need SyncBatchNorm, which runs on GPUs only. Tolerance 1e-3 on val/loss and
    equal val/acc: rounding-level, so a wrong shard, seed or LR scaling fails it."""
    results = []
    for name, extra in (("one", ["--data.batch_size=8", "--trainer.accelerator=cpu"]),
                        ("two", [*DDP, "--data.batch_size=4"])):
        (tmp_path / name).mkdir()
        args = ["fit", *fit_args(tiny_data, *extra, "--trainer.precision=32-true",
                                 "--model.backbone=timm/test_vit", "--model.input.size=64")]
        if name == "one":  # in this process; DDP's ranks in their own
            assert cli(args, tmp_path / name) == 0
        else:
            result = run_cli(args, cwd=tmp_path / name)
            assert result.returncode == 0, result.stderr[-4000:]
        series = scalars(only_run(tmp_path / name / "logs"))
        results.append({k: [v for _, v in series[k]] for k in ("val/acc", "val/loss")})
    print("one process:", results[0], "two processes:", results[1])
    assert results[0]["val/acc"] == results[1]["val/acc"]
    assert results[0]["val/loss"] == pytest.approx(results[1]["val/loss"], abs=1e-3)


@pytest.mark.distributed
def test_two_process_ddp_deals_each_unlabeled_image_to_one_rank_per_epoch(odd_data, tmp_path):
    """24 labeled images on 2 ranks at 4 a batch: 3 steps, so 12 unlabeled draws per rank an epoch
    (ratio 1) from 19 images: each rank cycles its own share, and no image goes to both."""
    unlabeled = tmp_path / "unlabeled"
    unlabeled.mkdir()
    images = sorted((odd_data / "val").rglob("*.png")) + sorted((odd_data / "test").rglob("*.png"))[:4]
    for i, path in enumerate(images):
        (unlabeled / f"{i:02d}.png").write_bytes(path.read_bytes())
    probe = tmp_path / "drawn"
    args = fit_args(odd_data, *DDP, "--data.batch_size=4", "--trainer.limit_val_batches=1",
                    f"--data.unlabeled.images={unlabeled}", "--data.unlabeled.ratio=1",
                    "--trainer.callbacks+=tests.probes.RecordUnlabeled", f"--trainer.callbacks.out={probe}",
                    epochs=2)
    result = run_cli(["fit", *args], cwd=tmp_path, env={"PYTHONPATH": str(REPO)})
    assert result.returncode == 0, result.stderr[-4000:]
    for epoch in range(2):
        drawn = [json.loads((probe / f"rank{r}-epoch{epoch}.json").read_text()) for r in range(2)]
        assert [len(d) for d in drawn] == [12, 12]
        assert set(drawn[0]).isdisjoint(drawn[1]) and set(drawn[0]) | set(drawn[1]) == set(range(19))
    first, second = ((probe / f"rank0-epoch{e}.json").read_text() for e in range(2))
    assert json.loads(first) != json.loads(second)  # a new draw each epoch
    # the pseudo-label statistics are summed over both ranks: 2 x 12 draws an epoch
    run = only_run(tmp_path / "logs")
    assert len(scalars(run)["train/unlabeled_above_threshold"]) == 2
