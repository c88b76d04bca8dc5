"""The LR schedule from the config: warmup + cosine, any torch scheduler, exact resumes."""

from __future__ import annotations

import functools
from pathlib import Path

import pytest
import torch

from project.errors import ConfigError
from project.model.schedule import (
    DeferredScheduler,
    WarmupCosine,
    global_batch_size,
    run_lengths,
    scaled_lr,
    unset_lengths,
    warmup_cosine,
)
from tests.conftest import EMA_PRESET, cli, fit_args, only_run, scalars

EVERY_EPOCH = ["--trainer.callbacks+=lightning.pytorch.callbacks.ModelCheckpoint",
               "--trainer.callbacks.every_n_epochs=1", "--trainer.callbacks.save_top_k=-1",
               "--trainer.callbacks.monitor=val/loss",  # a distinct callback state key
               "--trainer.callbacks.filename=ep{epoch}"]


def straight_and_resumed(args: list[str], tmp_path: Path) -> tuple[dict, dict, Path, Path]:
    """A 2-epoch fit (``args``, with EVERY_EPOCH) straight, and again resumed from its epoch-1
    checkpoint: both last checkpoints and run folders."""
    for name in ("straight", "resumed"):
        (tmp_path / name).mkdir()
    assert cli(["fit", *args], tmp_path / "straight") == 0
    run_a = only_run(tmp_path / "straight" / "logs")
    boundary = run_a / "checkpoints" / "epepoch=0.ckpt"  # after 1 of 2 epochs
    assert cli(["fit", *args, f"--ckpt_path={boundary}"], tmp_path / "resumed") == 0
    run_b = only_run(tmp_path / "resumed" / "logs")
    a, b = (torch.load(run / "checkpoints/last.ckpt", weights_only=True) for run in (run_a, run_b))
    return a, b, run_a, run_b


def test_warmup_then_cosine():
    f = warmup_cosine(warmup_steps=30, total_steps=130, start_factor=0.01)
    assert f(0) == pytest.approx(0.01) and f(15) == pytest.approx(0.01 + 0.99 * 0.5)
    assert f(30) == pytest.approx(1.0) and f(80) == pytest.approx(0.5)
    assert f(130) == pytest.approx(0.0, abs=1e-12)
    values = [f(s) for s in range(30, 131)]
    assert all(a >= b for a, b in zip(values, values[1:], strict=False))


def test_warmup_is_capped_to_a_share_of_the_run_and_ends_at_the_end_factor(caplog):
    caplog.set_level("INFO")
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
    sched = WarmupCosine(opt, warmup_epochs=3, total_steps=20, steps_per_epoch=4, end_factor=0.1)
    assert "warmup of 3 epochs (12 steps) clipped to 4 steps" in caplog.text
    lrs = []
    for _ in range(20):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert lrs[0] == pytest.approx(0.001) and lrs[4] == pytest.approx(0.1)
    assert opt.param_groups[0]["lr"] == pytest.approx(0.01)  # end_factor x the LR


def test_the_run_lengths_go_where_the_scheduler_leaves_them_unset():
    assert unset_lengths(WarmupCosine) == ["total_steps", "steps_per_epoch"]
    one_cycle = functools.partial(torch.optim.lr_scheduler.OneCycleLR, max_lr=0.1, total_steps=None,
                                  epochs=None, steps_per_epoch=None)
    assert unset_lengths(one_cycle) == ["total_steps", "steps_per_epoch", "epochs"]
    assert unset_lengths(functools.partial(torch.optim.lr_scheduler.StepLR, step_size=3)) == []
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1, momentum=0.9)
    deferred = DeferredScheduler(opt, one_cycle)
    assert opt.param_groups[0]["lr"] == 0.1  # nothing changes until the lengths are known
    deferred.build({"total_steps": 10, "steps_per_epoch": 5, "epochs": 2})
    assert opt.param_groups[0]["lr"] == pytest.approx(0.1 / 25)  # OneCycle's start: max_lr / 25


def test_an_epoch_is_counted_in_optimiser_steps_under_gradient_accumulation():
    """``accumulate_grad_batches=K`` (the out-of-memory advice) makes an epoch K times fewer
    steps: warmup in epochs, epoch-wise cosine and OneCycle's epochs follow it."""
    from types import SimpleNamespace

    trainer = SimpleNamespace(max_epochs=4, max_steps=-1, estimated_stepping_batches=20,
                              num_training_batches=10, accumulate_grad_batches=2, global_step=0,
                              current_epoch=0)
    assert run_lengths(trainer) == {"total_steps": 20, "steps_per_epoch": 5, "epochs": 4}


def test_a_length_in_epochs_is_said_to_count_steps(caplog):
    """StepLR's step_size or MultiStepLR's milestones read as epochs; stepped every optimiser step
    here, they count steps, and the run says so with the epoch's length."""
    caplog.set_level("INFO", logger="project")
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
    for factory, says in ((functools.partial(torch.optim.lr_scheduler.MultiStepLR, milestones=[30, 60]),
                           "MultiStepLR's milestones=[30, 60] counts optimiser steps here, not epochs "
                           "(an epoch is 50 steps)"), (WarmupCosine, None)):
        caplog.clear()
        DeferredScheduler(opt, factory).build({"total_steps": 500, "steps_per_epoch": 50, "epochs": 10})
        assert (says in caplog.text) if says else "not epochs" not in caplog.text


@pytest.mark.parametrize(("rule", "expected"), [("none", 0.01), ("linear", 0.08), ("sqrt", 0.01 * 8 ** 0.5)])
def test_lr_scaling_rules(rule, expected):
    batch = global_batch_size(batch_size=32, devices=4, num_nodes=2, accumulate=2)
    assert batch == 512 and scaled_lr(0.01, batch, base_batch=64, rule=rule) == pytest.approx(expected)


@pytest.mark.parametrize("scheduler", [
    pytest.param([], marks=pytest.mark.slow),  # the default, warmup + cosine: the same mechanism
    ["--model.scheduler=torch.optim.lr_scheduler.OneCycleLR", "--model.scheduler.max_lr=0.05"],
], ids=["warmup_cosine", "one_cycle"])
def test_a_resume_at_an_epoch_boundary_is_bit_exact(tiny_data, tmp_path, scheduler, caplog):
    """Two epochs straight, and one then a resume from the epoch-1 checkpoint: the same weights
    (raw and EMA), optimizer state, LRs and momenta, to the bit. MixUp draws its mixing from
    torch's generator: the same only if the resume restores it."""
    caplog.set_level("INFO")
    common = ["--trainer.deterministic=true", "--trainer.limit_train_batches=3", f"--config={EMA_PRESET}",
              "--model.mixup_alpha=0.4", *scheduler, *EVERY_EPOCH]
    a, b, run_a, run_b = straight_and_resumed(fit_args(tiny_data, *common, epochs=2), tmp_path)
    assert a["global_step"] == b["global_step"] == 6
    for state in ("state_dict", "current_model_state"):  # the EMA weights and the raw ones
        for key, tensor in a[state].items():
            assert torch.equal(tensor, b[state][key]), (state, key)
    for group_a, group_b in zip(a["optimizer_states"][0]["param_groups"],
                                b["optimizer_states"][0]["param_groups"], strict=True):
        assert group_a["lr"] == group_b["lr"] and group_a["momentum"] == group_b["momentum"]
    assert a["lr_schedulers"] == b["lr_schedulers"]
    assert scalars(run_a)["val/acc"][-1] == scalars(run_b)["val/acc"][-1]
    if scheduler:  # OneCycle moves the momentum too, and the run says so
        momenta = {g["momentum"] for g in a["optimizer_states"][0]["param_groups"]}
        assert momenta != {0.9} and "OneCycleLR also cycles the optimizer's momentum" in caplog.text


def test_cosine_interval_epoch_holds_the_lr_through_each_epoch(tiny_data, tmp_path):
    """``model.scheduler.init_args.cosine_interval: epoch`` from the command line: the logged LR
    changes at epoch starts only (2 steps an epoch, 3 epochs: 1, 0.75, 0.25 of the LR); a
    misspelling fails in one line."""
    args = fit_args(tiny_data, "--trainer.limit_train_batches=2", "--trainer.limit_val_batches=1",
                    "--model.scheduler.init_args.warmup_epochs=0", epochs=3)
    assert cli(["fit", *args, "--model.scheduler.init_args.cosine_interval=epoch"], tmp_path) == 0
    lrs = [v for _, v in scalars(only_run(tmp_path / "logs"))["train/lr"]]
    assert lrs == pytest.approx([0.01] * 2 + [0.0075] * 2 + [0.0025] * 2)
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
    with pytest.raises(ConfigError, match="model.scheduler.cosine_interval"):
        WarmupCosine(opt, cosine_interval="epochs", total_steps=10, steps_per_epoch=5)


@pytest.mark.parametrize(("done", "epochs", "batches", "total"), [
    (0, 0, 10, 40),  # a new run: Lightning's estimate, max_epochs x today's epoch
    (20, 2, 10, 40),  # resumed at an epoch's end, epochs as long as before: the same
    (25, 2, 10, 40),  # resumed mid-epoch (a stop), as long as before: the same, so resumes stay exact
    (20, 2, 5, 30),  # resumed with a batch twice as large: 20 done + 2 epochs of 5, not 4 x 5 (LR 0)
    (20, 2, 20, 60),  # with half the batch: 20 done + 2 epochs of 20, not 4 x 20
])
def test_a_resume_with_epochs_of_another_length_schedules_the_steps_it_takes(done, epochs, batches, total):
    from types import SimpleNamespace

    from project.model.schedule import run_lengths

    trainer = SimpleNamespace(max_epochs=4, max_steps=-1, estimated_stepping_batches=4 * batches,
                              num_training_batches=batches, accumulate_grad_batches=1, global_step=done,
                              current_epoch=epochs)
    assert run_lengths(trainer)["total_steps"] == total
    capped = {**vars(trainer), "max_steps": 25, "estimated_stepping_batches": min(25, 4 * batches)}
    assert run_lengths(SimpleNamespace(**capped))["total_steps"] == min(total, 25)
