"""What :class:`~project.callbacks.resilience.Resilience` does off a plain run's path: a resumed
run's random states restored, and ``last.ckpt`` saved when a run is stopped."""

import random
from pathlib import Path

import lightning as L
import numpy as np
import torch
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities import rank_zero_info


def restore_rng_states(states: dict) -> None:
    """Python's, NumPy's and torch's generators as the checkpoint saved them."""
    version, state, gauss = states["python"]
    random.setstate((version, tuple(state), gauss))
    name, keys, pos, has_gauss, cached = states["numpy"]
    np.random.set_state((name, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(states["torch"])
    if states["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["cuda"])


def save_on_stop(trainer: L.Trainer, exception: BaseException) -> None:
    """``last.ckpt`` of a fit stopped by Ctrl+C or SIGTERM, so that ``make resume`` goes on."""
    cb = trainer.checkpoint_callback
    if cb is None or cb.dirpath is None or trainer.state.fn != TrainerFn.FITTING:
        return
    path = Path(cb.dirpath) / f"{cb.CHECKPOINT_NAME_LAST}{cb.FILE_EXTENSION}"
    trainer.save_checkpoint(path)
    signal_name = "Ctrl+C" if isinstance(exception, KeyboardInterrupt) else "SIGTERM"
    rank_zero_info(f"\n{signal_name}: stopped at epoch {trainer.current_epoch}, step "
                   f"{trainer.global_step}; saved {path}. Continue with `make resume`.")
