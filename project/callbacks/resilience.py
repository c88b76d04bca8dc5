"""Checkpoints that survive crashes, and resumes that continue exactly."""

import random
from typing import Any

import lightning as L
import numpy as np
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.plugins.io import TorchCheckpointIO
from lightning.pytorch.utilities.exceptions import SIGTERMException

from project.common.files import atomic_path


class AtomicCheckpointIO(TorchCheckpointIO):
    """Each checkpoint written to a temporary file, fsynced, renamed: never a truncated one."""

    def save_checkpoint(self, checkpoint: dict[str, Any], path, storage_options=None) -> None:
        if "://" in str(path):  # remote storage: Lightning's fsspec writer
            return super().save_checkpoint(checkpoint, path, storage_options)
        with atomic_path(path) as tmp, open(tmp, "wb") as f:
            torch.save(checkpoint, f)


class Resilience(Callback):
    """Exact resumes (the RNG states join the checkpoint) and clean stops: SIGTERM or Ctrl+C write
    ``last.ckpt``; other exceptions save nothing, so the last good one stays."""

    key = "rng_states"

    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule,
                           checkpoint: dict[str, Any]) -> None:
        version, state, gauss = random.getstate()
        name, keys, pos, has_gauss, cached = np.random.get_state()
        checkpoint[self.key] = {
            "python": [version, list(state), gauss],
            "numpy": [name, keys.tolist(), pos, has_gauss, cached],
            "torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        }

    def on_load_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule,
                           checkpoint: dict[str, Any]) -> None:
        from project.callbacks.recovery import follow_moved_run, restore_rng_states

        if checkpoint.get(self.key):  # a resumed run
            restore_rng_states(checkpoint[self.key])
        follow_moved_run(trainer, checkpoint)

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule,
                     exception: BaseException) -> None:
        if isinstance(exception, KeyboardInterrupt | SIGTERMException):
            from project.callbacks.recovery import save_on_stop

            save_on_stop(trainer, exception)
