"""Temperature scaling at the end of fit: the best checkpoint leaves training calibrated."""

from __future__ import annotations

import logging
from pathlib import Path

import lightning as L
from lightning.pytorch.callbacks import Callback

from project.callbacks.summary import monitored_checkpoint
from project.model.calibration import calibrate_checkpoint, format_numbers

log = logging.getLogger("project")


class TemperatureScaling(Callback):
    """After fit, fit the temperature of the best checkpoint on the validation set and store it
    there (``python -m project calibrate`` does the same for any checkpoint).

    The best checkpoint's own weights predict the validation images again (one pass, on the
    global-zero process only); its file is rewritten atomically with the temperature, and the
    NLL and ECE before and after are printed and logged as ``calibration/*``.
    """

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not trainer.is_global_zero or trainer.interrupted:
            return
        callback = monitored_checkpoint(trainer)
        best = callback.best_model_path if callback is not None else ""
        dataset = getattr(trainer.datamodule, "datasets", {}).get("val")
        if not best or not Path(best).is_file() or dataset is None:
            # e.g. a run resumed in another folder: the restored best path is the old run's
            log.info("Notice: no temperature fitted (needs the best checkpoint%s and a validation "
                     "set); run `python -m project calibrate --ckpt_path PATH` later",
                     f", {best} is not there" if best else "")
            return
        numbers = calibrate_checkpoint(best, dataset=dataset, batch_size=trainer.datamodule.batch_size,
                                       device=pl_module.device)
        log.info("%s; stored in %s", format_numbers(numbers), best)
        for logger in trainer.loggers:
            logger.log_metrics({f"calibration/{k}": float(v) for k, v in numbers.items()},
                               step=trainer.global_step)
