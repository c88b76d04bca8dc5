"""Read this project's checkpoints safely (``weights_only``) and rebuild the model: the one
checkpoint reader of every command."""

from __future__ import annotations

import inspect
import logging
import pickle
import zipfile
from pathlib import Path

import torch

from project.errors import CheckpointError
from project.tasks import DEFAULT, MULTI_LABEL

log = logging.getLogger("project")


def read_checkpoint(path: str | Path, **kwargs) -> dict:
    """``torch.load(weights_only=True)`` with one clear error for a missing or foreign file."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint '{path}' does not exist")
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True, **kwargs)
    except (OSError, RuntimeError, ValueError, EOFError, KeyError, pickle.UnpicklingError,
            zipfile.BadZipFile) as err:
        raise CheckpointError(f"'{path}' is not a readable checkpoint ({type(err).__name__}); it may be "
                              "truncated or not a checkpoint of this project") from err
    if not isinstance(ckpt, dict) or "state_dict" not in ckpt:
        raise CheckpointError(f"'{path}' is not a Lightning checkpoint (it has no state_dict)")
    return ckpt


def load_model(path: str | Path):
    """The trained ImageClassifier of a checkpoint, in eval mode, built without pretrained weights
    (the checkpoint has all of them): works offline and never downloads."""
    from project.model import ImageClassifier

    ckpt = read_checkpoint(path)
    hparams = dict(ckpt.get("hyper_parameters", {}))
    if not hparams.get("class_names"):
        raise CheckpointError(f"'{path}' holds no class names (hyper_parameters.class_names); it was "
                              "not written by this project's training")
    if "multilabel_loss" in hparams:  # written before model.loss was the task's
        old = hparams.pop("multilabel_loss")
        hparams.setdefault("loss", old if hparams.get("task") == MULTI_LABEL else None)
    allowed = inspect.signature(ImageClassifier.__init__).parameters
    unknown = sorted(set(hparams) - set(allowed))
    if unknown:
        log.warning("Notice: '%s' holds settings this version does not know, left out: %s", path,
                    ", ".join(unknown))
    hparams = {k: v for k, v in hparams.items() if k in allowed}
    hparams.update(weights=None, compile=False, optimizer=None, scheduler=None)
    model = ImageClassifier(**hparams)
    state = {"temperature": torch.ones(()), **ckpt["state_dict"]}  # uncalibrated: T = 1, as used
    try:
        model.load_state_dict(state)
    except RuntimeError as err:
        raise CheckpointError(f"'{path}' does not fit the model its settings describe (another head or "
                              f"backbone than model.head={hparams.get('head', 'linear')}, "
                              f"{hparams.get('backbone')}): {str(err).splitlines()[0]}") from err
    model.on_load_checkpoint(ckpt)  # the task's state (a multi-label model's thresholds)
    return model.eval()


def checkpoint_task(path: str | Path) -> str:
    """The name of a checkpoint's task (``project/tasks/``; older checkpoints: one class per image)."""
    return (read_checkpoint(path, mmap=True).get("hyper_parameters") or {}).get("task", DEFAULT)


def check_checkpoint_classes(path: str | Path, class_names: list[str]) -> None:
    """Fail before any work when a checkpoint was trained on other classes than the data's."""
    saved = list(read_checkpoint(path, mmap=True).get("hyper_parameters", {}).get("class_names") or [])
    if saved and saved != list(class_names):
        only_ckpt = [c for c in saved if c not in class_names]
        only_data = [c for c in class_names if c not in saved]
        detail = (f"only in the checkpoint: {only_ckpt or 'none'}; only in the data: {only_data or 'none'}"
                  if only_ckpt or only_data else "same names, other order")
        raise CheckpointError(f"checkpoint '{path}' was trained on different classes than data.data_dir "
                              f"has ({detail}). Use the data folder it was trained on, or start a new run.")


def datamodule_for(ckpt_path: str | Path, model, data_dir: str | None = None):
    """The run's data module, rebuilt from the settings the checkpoint stored (``data_dir``
    overrides its folder), with the model's preprocessing and no cache (one pass)."""
    from project.data import FolderDataModule

    stored = dict(read_checkpoint(ckpt_path, mmap=True).get("datamodule_hyper_parameters") or {})
    allowed = inspect.signature(FolderDataModule.__init__).parameters
    settings = {k: v for k, v in stored.items() if k in allowed}
    settings["data_dir"] = data_dir or settings.get("data_dir")
    if not settings["data_dir"]:
        raise CheckpointError(f"'{ckpt_path}' does not say which data it was trained on: pass --data_dir DIR")
    dm = FolderDataModule(**{**settings, "cache": "none"})
    dm.model_preprocessing = model.preprocessing
    return dm
