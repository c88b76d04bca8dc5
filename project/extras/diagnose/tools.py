"""Diagnosis commands from the troubleshooting table, built on Lightning's Trainer and Tuner.

    python -m project overfit          [--config ...] [overrides] [--steps 100]
    python -m project lr-find          [--config ...] [overrides] [--output lr_find.png]
    python -m project find-batch-size  [--config ...] [overrides]
"""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path

import lightning as L
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.tuner import Tuner

from project.errors import ProjectError

DEFAULT_CONFIG = "configs/train.yaml"
# A tool run: no logs, no checkpoints, no progress bars, just the measurement.
QUIET = ["--trainer.logger=false", "--trainer.enable_checkpointing=false",
         "--trainer.callbacks=[]", "--trainer.enable_progress_bar=false",
         "--trainer.enable_model_summary=false"]


def split_configs(args: list[str]) -> tuple[list[str], list[str]]:
    """(the ``--config`` arguments, the rest): config files must come before any override."""
    configs, rest, i = [], [], 0
    while i < len(args):
        if args[i] == "--config" and i + 1 < len(args):
            configs += args[i:i + 2]
            i += 2
            continue
        (configs if args[i].startswith("--config=") else rest).append(args[i])
        i += 1
    return configs or ["--config", DEFAULT_CONFIG], rest


FIT_ARGS = ("Other arguments are fit's: --config FILE (default configs/train.yaml) and --key=value "
            "overrides; no run folder is written")


def build(tool_args: list[str], overrides: list[str]):
    """Model, data module and trainer from the config, the tool's settings and the user's
    overrides (in that order), without running anything."""
    from project.cli import ProjectCLI

    configs, rest = split_configs(overrides)
    return ProjectCLI(args=[*configs, *QUIET, *tool_args, *rest], run=False, tool=True)


class _LossRecorder(Callback):
    def __init__(self) -> None:
        self.losses: list[float] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if outputs is not None:
            self.losses.append(float(outputs["loss"]))


def overfit_verdict(losses: list[float], target: float) -> bool:
    return bool(losses) and min(losses[-5:]) <= target


def overfit_causes(model: L.LightningModule) -> list[str]:
    """The likely reasons a model cannot fit a single batch, most specific first."""
    causes = []
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    if trainable == 0:
        causes.append("every parameter is frozen (requires_grad=False): nothing can learn")
    if getattr(model, "lr", 1.0) <= 0:
        causes.append(f"the learning rate is {model.lr}: set model.lr > 0 (try make lr-find)")
    causes += [
        "learning rate too small or too large for this model (make lr-find)",
        "labels that do not match the images (check the class folders)",
        "layers not registered as parameters, e.g. in a plain list (the run's start-up check "
        "names them), or a frozen backbone (the FreezeBackbone callback)",
        "random augmentation on the batch (this check sets data.augmentation=null; an override "
        "may have turned it back on)",
    ]
    return causes


def overfit(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m project overfit", epilog=FIT_ARGS,
                                description="Can the model fit one batch? (the single-batch check)")
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--target", type=float, default=0.1,
                   help="PASS when the loss falls to this fraction of its first value")
    a, overrides = p.parse_known_args(argv)
    cli = build(["--data.augmentation=null", "--trainer.overfit_batches=1",
                 "--trainer.limit_val_batches=0", "--trainer.num_sanity_val_steps=0",
                 f"--trainer.max_steps={a.steps}", f"--trainer.max_epochs={a.steps}",
                 "--model.scheduler=null"], overrides)
    return run_overfit(cli.trainer, cli.model, cli.datamodule, a.target)


def run_overfit(trainer: L.Trainer, model: L.LightningModule, datamodule, target: float) -> int:
    recorder = _LossRecorder()
    trainer.callbacks.append(recorder)
    if sum(p.numel() for p in model.parameters() if p.requires_grad):
        trainer.fit(model, datamodule)
    losses = recorder.losses
    goal = target * losses[0] if losses else 0.0
    if overfit_verdict(losses, goal):
        print(f"PASS: the loss on one batch fell from {losses[0]:.4f} to {min(losses):.4f} in "
              f"{len(losses)} steps: model, labels and optimiser can learn.")
        return 0
    seen = f"from {losses[0]:.4f} to {min(losses):.4f} in {len(losses)} steps" if losses else "never"
    print(f"FAIL: the loss on one batch did not fall to {goal:.4f} ({seen}). Likely causes:")
    for cause in overfit_causes(model):
        print(f"  - {cause}")
    return 1


def lr_find(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m project lr-find", epilog=FIT_ARGS,
                                description="Lightning's learning-rate range test")
    p.add_argument("--output", default="logs/lr_find.png")
    p.add_argument("--min_lr", type=float, default=1e-6)
    p.add_argument("--max_lr", type=float, default=1.0)
    p.add_argument("--num_training", type=int, default=100)
    a, overrides = p.parse_known_args(argv)
    cli = build([], overrides)
    finder = Tuner(cli.trainer).lr_find(cli.model, datamodule=cli.datamodule, min_lr=a.min_lr,
                                        max_lr=a.max_lr, num_training=a.num_training,
                                        update_attr=False)
    if finder is None:
        raise ProjectError("the LR finder did not run (is fast_dev_run set?)")
    out = Path(a.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    from project.extras.analysis.plots import save

    save(finder.plot(suggest=True), out)
    suggestion = finder.suggestion()
    print(f"Loss vs learning rate: {out}")
    if suggestion is None:
        print("No suggestion: the loss curve has no clear descent (try more --num_training).")
        return 1
    factor, batch = lr_factor(cli)
    lr = suggestion / factor  # the finder sets every group's LR; model.lr is scaled, then applied
    scaled = (f"; as model.lr {lr:.3g}: lr_scaling={cli.model.hparams.lr_scaling} multiplies it by "
              f"{factor:.3g} for this global batch of {batch}" if factor != 1 else "")
    print(f"Suggested learning rate: {suggestion:.3g}, applied to every layer{scaled}\nUse it with: "
          f"{fit_command(overrides, f'--model.lr={lr:.3g}')}")
    return 0


def lr_factor(cli) -> tuple[float, int]:
    """(what ``model.lr_scaling`` multiplies ``model.lr`` by in this run, the global batch)."""
    from project.model import schedule

    model, t = cli.model, cli.trainer
    batch = schedule.global_batch_size(model.per_device_batch, t.num_devices, t.num_nodes,
                                       t.accumulate_grad_batches)
    return schedule.scaled_lr(1.0, batch, model.hparams.base_batch_size, model.hparams.lr_scaling), batch


def fit_command(overrides: list[str], setting: str) -> str:
    """The fit command of the tool's own config and overrides, with ``setting`` in place of theirs."""
    key = setting.split("=", 1)[0]
    configs, rest = split_configs(overrides)
    kept = [a for a in rest if a.split("=", 1)[0] != key]
    return " ".join(["python -m project fit", *map(shlex.quote, [*configs, *kept, setting])])


def find_batch_size(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m project find-batch-size", epilog=FIT_ARGS,
                                description="Lightning's batch size finder (for out-of-memory)")
    p.add_argument("--mode", default="power", choices=("power", "binsearch"))
    p.add_argument("--max_trials", type=int, default=6)
    a, overrides = p.parse_known_args(argv)
    cli = build([], overrides)
    size = Tuner(cli.trainer).scale_batch_size(cli.model, datamodule=cli.datamodule, mode=a.mode,
                                               max_trials=a.max_trials, init_val=2)
    train = len(cli.datamodule.datasets.get("train") or [])
    if size >= train:  # Lightning's search never goes past the split
        found = (f"Batch size {size}: the training split has {train} images, so no larger batch was "
                 "tried (memory was not the limit)")
    elif size >= 2 ** a.max_trials:  # doubling from 2, --max_trials times
        found = (f"Batch size {size} fits; the search stopped at --max_trials {a.max_trials} before "
                 "memory ran out (raise it to try larger)")
    else:
        found = f"Largest batch size that fits: {size} (a larger one ran out of memory)"
    print(f"{found}\nUse it with: {fit_command(overrides, f'--data.batch_size={size}')} (and consider "
          "--model.lr_scaling=linear so the learning rate follows the batch)")
    return 0
