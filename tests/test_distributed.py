"""Scale-out on CPU: real 2-process DDP (gloo), the distributed sampler, LR scaling."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from project.data.samplers import EpochSampler, class_balanced_weights
from project.model.schedule import global_batch_size, scaled_lr
from tests.conftest import fit_args, only_run, run_cli, scalars

DDP = ["--trainer.accelerator=cpu", "--trainer.devices=2", "--trainer.strategy=ddp"]


def test_distributed_weighted_sampler_is_disjoint_balanced_and_new_each_epoch():
    targets = torch.tensor([0] * 80 + [1] * 20)
    weights = class_balanced_weights(targets, 2)
    ranks = [EpochSampler(100, weights, seed=3, num_replicas=2, rank=r) for r in (0, 1)]
    single = EpochSampler(100, weights, seed=3)
    draws = []
    for epoch in range(30):
        for s in (*ranks, single):
            s.set_epoch(epoch)
        keys = [list(s) for s in ranks]
        assert len(keys[0]) == len(keys[1]) == 50
        positions = [set(range(r, 100, 2)) for r in (0, 1)]
        assert positions[0].isdisjoint(positions[1])  # disjoint shares of the draw...
        union = [None] * 100
        union[0::2], union[1::2] = keys
        assert union == list(single)  # ...that together are exactly the one common draw
        draws.append([i for i, _ in union])
    assert draws[0] != draws[1]
    share = Counter(int(targets[i]) for d in draws for i in d)[1] / (30 * 100)
    assert 0.45 < share < 0.55  # class-balanced despite 80/20 data


@pytest.mark.parametrize(("rule", "expected"), [("none", 0.01), ("linear", 0.08), ("sqrt", 0.01 * 8 ** 0.5)])
def test_lr_scaling_rules(rule, expected):
    batch = global_batch_size(batch_size=32, devices=4, num_nodes=2, accumulate=2)
    assert batch == 512
    assert scaled_lr(0.01, batch, base_batch=64, rule=rule) == pytest.approx(expected)


@pytest.mark.distributed
def test_two_process_ddp_fit_writes_one_run_and_resumes(tiny_data, tmp_path):
    args = fit_args(tiny_data, *DDP, "--data.batch_size=4", "--model.lr_scaling=linear",
                    "--model.base_batch_size=4", epochs=1)
    result = run_cli(["fit", *args], cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-4000:]
    run = only_run(tmp_path / "logs")  # exactly one run folder...
    ckpts = sorted(p.name for p in (run / "checkpoints").iterdir())
    assert len(ckpts) == 2 and "last.ckpt" in ckpts  # ...and one set of checkpoints
    assert len(list(run.glob("events.out.tfevents*"))) == 1
    assert "Global batch 8 (4 per device x 2 devices" in result.stderr + result.stdout
    series = scalars(run)
    assert len(series["val/acc"]) == 1
    # validation is synced: 12 images in all, each counted once, so accuracy is k/12
    assert round(series["val/acc"][0][1] * 12, 4) == round(series["val/acc"][0][1] * 12)

    resumed = run_cli(["resume", "--trainer.max_epochs=2"], cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    assert only_run(tmp_path / "logs") == run
    ckpt = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)
    assert ckpt["epoch"] == 1 and ckpt["hyper_parameters"]["lr_scaling"] == "linear"


@pytest.mark.distributed
def test_one_and_two_processes_with_the_same_global_batch_agree(tiny_data, tmp_path):
    """Same seed and global batch (8 = 8 x 1 = 4 x 2): both runs see the same images with the
    same augmentation in the same global batches, and DDP averages the halves' gradients, so
    the runs are the same computation up to the order of float sums. The model is a ViT
    (vit_b_32), whose LayerNorm and zero dropout make the halves independent: BatchNorm would
    need SyncBatchNorm, which runs on GPUs only. Tolerance 1e-3 on val/loss and equal val/acc:
    rounding-level, so a wrong shard, seed or LR scaling fails it."""
    results = []
    for name, extra in (("one", ["--data.batch_size=8", "--trainer.accelerator=cpu"]),
                        ("two", [*DDP, "--data.batch_size=4"])):
        (tmp_path / name).mkdir()
        args = fit_args(tiny_data, *extra, "--trainer.precision=32-true",
                        "--model.backbone=vit_b_32", "--data.image_size=224")
        result = run_cli(["fit", *args], cwd=tmp_path / name)
        assert result.returncode == 0, result.stderr[-4000:]
        series = scalars(only_run(tmp_path / name / "logs"))
        results.append({k: [v for _, v in series[k]] for k in ("val/acc", "val/loss")})
    print("one process:", results[0], "two processes:", results[1])
    assert results[0]["val/acc"] == results[1]["val/acc"]
    assert results[0]["val/loss"] == pytest.approx(results[1]["val/loss"], abs=1e-3)
