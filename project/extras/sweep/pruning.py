"""Inside a trial's training run: report the metric to Optuna each validation epoch, stop early
when the pruner says so, and leave the run's result in ``sweep_result.json``.

Written against ``lightning.pytorch`` (Optuna's own integration targets the older
``pytorch_lightning`` package and is not installed here). The sweep adds this callback to the
trial's command line and passes the study through environment variables, so the trial stays an
ordinary ``fit`` run. Under DDP only rank 0 talks to the database; its prune decision is
broadcast, so every rank stops at the same epoch.
"""

from __future__ import annotations

import json
import logging
import math
import os

import lightning as L
from lightning.pytorch.callbacks import Callback

from project.callbacks.summary import monitored_checkpoint
from project.common.files import write_text
from project.errors import ConfigError

log = logging.getLogger("project")

CALLBACK = "project.extras.sweep.pruning.TrialReport"
RESULT_FILE = "sweep_result.json"
ENV_METRIC = "PROJECT_SWEEP_METRIC"
ENV_DIRECTION = "PROJECT_SWEEP_DIRECTION"
ENV_STORAGE = "PROJECT_SWEEP_STORAGE"
ENV_STUDY = "PROJECT_SWEEP_STUDY"
ENV_TRIAL = "PROJECT_SWEEP_TRIAL"  # the trial number
ENV_PRUNER = "PROJECT_SWEEP_PRUNER"


class TrialReport(Callback):
    """Reports ``metric`` (default from the environment) per epoch; prunes; writes the result."""

    def __init__(self, metric: str | None = None, direction: str | None = None) -> None:
        self.metric = metric or os.environ.get(ENV_METRIC, "val/acc")
        self.direction = direction or os.environ.get(ENV_DIRECTION, "maximize")
        self.history: list[float] = []
        self.pruned_epoch: int | None = None
        self.trial = None

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage == "fit" and trainer.is_global_zero and os.environ.get(ENV_STORAGE):
            self.trial = RunningTrial()

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.sanity_checking:
            return
        if self.metric not in trainer.callback_metrics:
            raise ConfigError(f"--metric {self.metric} is not logged by this run (it logs: "
                              f"{', '.join(sorted(trainer.callback_metrics))})")
        value = float(trainer.callback_metrics[self.metric])
        self.history.append(value)
        prune = False
        if self.trial is not None:
            epoch = trainer.current_epoch
            self.trial.report(value if math.isfinite(value) else _worst(self.direction), epoch)
            prune = self.trial.should_prune() or not math.isfinite(value)
        if trainer.strategy.broadcast(prune, src=0):
            self.pruned_epoch = trainer.current_epoch
            trainer.should_stop = True
            if trainer.is_global_zero:
                log.info("Pruned by the sweep after epoch %d: %s=%.4f is worse than other trials "
                         "at this epoch.", trainer.current_epoch, self.metric, value)

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        log_dir = trainer.log_dir  # a collective under DDP: every rank must ask
        if not trainer.is_global_zero or log_dir is None:
            return
        write_text(os.path.join(log_dir, RESULT_FILE), json.dumps({
            "metric": self.metric, "direction": self.direction, "value": self.best(trainer),
            "epochs": len(self.history), "pruned_epoch": self.pruned_epoch, "history": self.history,
        }, indent=2))

    def best(self, trainer: L.Trainer) -> float | None:
        """The best epoch's value: the best checkpoint's score when it monitors this metric."""
        ckpt = monitored_checkpoint(trainer)
        maximize = self.direction == "maximize"
        if (ckpt is not None and ckpt.monitor == self.metric and ckpt.best_model_score is not None
                and (ckpt.mode == "max") == maximize):
            return float(ckpt.best_model_score)
        finite = [v for v in self.history if math.isfinite(v)]
        return (max(finite) if maximize else min(finite)) if finite else None


def _worst(direction: str) -> float:
    return -1e30 if direction == "maximize" else 1e30


class RunningTrial:
    """The trial this process trains, found by its number in the study the sweep set in the
    environment; reports and asks the pruner through Optuna's public storage API."""

    def __init__(self) -> None:
        import optuna

        from project.extras.sweep.study import make_pruner, open_storage

        self.storage = open_storage(os.environ[ENV_STORAGE])
        self.study = optuna.load_study(study_name=os.environ[ENV_STUDY], storage=self.storage,
                                       pruner=make_pruner(os.environ.get(ENV_PRUNER, "none")))
        self.trial_id = self.storage.get_trial_id_from_study_id_trial_number(
            self.storage.get_study_id_from_name(self.study.study_name), int(os.environ[ENV_TRIAL]))

    def report(self, value: float, step: int) -> None:
        self.storage.set_trial_intermediate_value(self.trial_id, step, value)

    def should_prune(self) -> bool:
        return self.study.pruner.prune(self.study, self.storage.get_trial(self.trial_id))
