"""What :class:`~project.callbacks.resilience.Resilience` does off a plain run's path: a resumed
run's random states restored, and ``last.ckpt`` saved when a run is stopped."""

import random
from pathlib import Path

import lightning as L
import numpy as np
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
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


def follow_moved_run(trainer: L.Trainer, checkpoint: dict) -> None:
    """A run resumed in its own folder under another spelling (moved, copied, an absolute path):
    Lightning keeps a ModelCheckpoint's best only when its stored folder is spelt as today's, else
    the first resumed epoch is the new best however bad, beside the old. The stored state is
    pointed at today's folder, where its files are."""
    here = Path(trainer.ckpt_path).resolve().parent if trainer.ckpt_path else None
    for cb in trainer.checkpoint_callbacks:
        state = checkpoint.get("callbacks", {}).get(cb.state_key) if isinstance(cb, ModelCheckpoint) else None
        if not state or not cb.dirpath or Path(cb.dirpath).resolve() != here:
            continue  # fit --ckpt_path into a new run folder: the old files are not there
        old, new = str(state.get("dirpath") or ""), str(cb.dirpath)
        state["dirpath"] = new
        for key in ("best_model_path", "kth_best_model_path", "last_model_path"):
            if isinstance(state.get(key), str):
                state[key] = _moved(state[key], old, new)
        if isinstance(state.get("best_k_models"), dict):
            state["best_k_models"] = {_moved(k, old, new): v for k, v in state["best_k_models"].items()}


def _moved(path: str, old: str, new: str) -> str:
    return new + path[len(old):] if old and path.startswith(old) else path


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
