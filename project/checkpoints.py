"""Read this project's checkpoints safely (``weights_only``) and rebuild the model: the one
checkpoint reader of every command. A fitted temperature lives beside its checkpoint
(``<ckpt>.calibration.json``), so calibrating never changes the bytes training wrote."""

from __future__ import annotations

import hashlib
import inspect
import json
import logging
import math
import pickle
import zipfile
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from project import tasks
from project.errors import CheckpointError, ConfigError

if TYPE_CHECKING:
    from jsonargparse import Namespace

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
    (the checkpoint has all of them): works offline and never downloads. Its temperature is the
    one in the checkpoint's side file when there is one (:func:`apply_calibration`)."""
    from project.model import ImageClassifier

    ckpt = read_checkpoint(path)
    hparams = dict(ckpt.get("hyper_parameters", {}))
    if not hparams.get("class_names"):
        raise CheckpointError(f"'{path}' holds no class names (hyper_parameters.class_names); it was "
                              "not written by this project's training")
    if "head_hidden" in hparams or isinstance(hparams.get("head"), str):  # before model.head was a group
        hparams["head"] = {"kind": hparams.get("head", "linear"), "hidden": hparams.pop("head_hidden", 512),
                           "dropout": hparams.pop("head_dropout", 0.0)}
    if "image_size" in hparams:  # before model.input was a group
        old = ("crop_ratio", "interpolation", "mean", "std")
        hparams["input"] = {"size": hparams.pop("image_size"), **{k: hparams.pop(k, None) for k in old}}
    hparams = known_settings(hparams, ImageClassifier, path, "settings")
    hparams.update(weights=None, compile=False, optimizer=None, scheduler=None)
    model = ImageClassifier(**hparams)
    state = {"temperature": torch.ones(()), **ckpt["state_dict"]}  # uncalibrated: T = 1, as used
    try:
        model.load_state_dict(state)
    except RuntimeError as err:
        raise CheckpointError(f"'{path}' does not fit the model its settings describe (another head or "
                              f"backbone than model.head={hparams.get('head')}, "
                              f"{hparams.get('backbone')}): {str(err).splitlines()[0]}") from err
    model.on_load_checkpoint(ckpt)  # the task's state (a multi-label model's thresholds)
    apply_calibration(model, path)
    return model.eval()


def calibration_path(ckpt_path: str | Path) -> Path:
    """Where the temperature fitted for a checkpoint is kept: beside it, ``<name>.calibration.json``
    (not inside it: evaluate and calibrate leave the file they read as training wrote it)."""
    ckpt_path = Path(ckpt_path)
    return ckpt_path.with_name(f"{ckpt_path.name}.calibration.json")


def file_sha256(path: str | Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def read_calibration(ckpt_path: str | Path) -> dict | None:
    """The numbers of the temperature fitted for ``ckpt_path`` (its side file), or None: none
    fitted, or fitted for other weights than the file holds now (a resumed run rewrote
    ``last.ckpt``), which a notice says. A broken side file is an error naming it."""
    path = calibration_path(ckpt_path)
    if not path.is_file():
        return None
    fix = f"delete it, or fit it again with `python -m project calibrate --ckpt_path {ckpt_path}`"
    try:
        numbers = json.loads(path.read_text(encoding="utf-8"))
        temperature = float(numbers["temperature"])
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise CheckpointError(f"temperature file '{path}' is unreadable ({type(err).__name__}: "
                              f"{str(err).splitlines()[0] if str(err) else 'no detail'}): {fix}") from err
    if not (math.isfinite(temperature) and temperature > 0):
        raise CheckpointError(f"temperature file '{path}' holds temperature {numbers['temperature']!r}; "
                              f"it must be a number above 0: {fix}")
    fitted_for = numbers.get("checkpoint_sha256")
    if fitted_for and fitted_for != file_sha256(ckpt_path):
        log.warning("Notice: '%s' was fitted for other weights than '%s' holds now (the checkpoint was "
                    "rewritten): ignored; run `python -m project calibrate --ckpt_path %s` to fit it again",
                    path, ckpt_path, ckpt_path)
        return None
    return {**numbers, "temperature": temperature}


def apply_calibration(model, ckpt_path: str | Path) -> float | None:
    """Set ``model.temperature`` from ``ckpt_path``'s side file, when it has a valid one; else the
    model keeps what its weights hold (1, or a temperature older versions wrote into the
    checkpoint). The temperature applied, or None."""
    numbers = read_calibration(ckpt_path)
    if numbers is None:
        return None
    model.temperature.fill_(numbers["temperature"])
    return numbers["temperature"]


def checkpoint_task(path: str | Path):
    """The task class of a checkpoint (``project/tasks/``; one that names none: the default)."""
    return tasks.task_class((read_checkpoint(path, mmap=True).get("hyper_parameters") or {}).get("task"))


def check_checkpoint_classes(path: str | Path, class_names: list[str]) -> None:
    """Fail before any work when a checkpoint was trained on other classes than the data's. A run
    trained from a labels table names the table: it, not the folder, holds the classes."""
    ckpt = read_checkpoint(path, mmap=True)
    saved = list(ckpt.get("hyper_parameters", {}).get("class_names") or [])
    if saved and saved != list(class_names):
        only_ckpt = [c for c in saved if c not in class_names]
        only_data = [c for c in class_names if c not in saved]
        detail = (f"only in the checkpoint: {only_ckpt or 'none'}; only in the data: {only_data or 'none'}"
                  if only_ckpt or only_data else "same names, other order")
        table = (ckpt.get("datamodule_hyper_parameters") or {}).get("labels")
        if table:
            raise CheckpointError(f"checkpoint '{path}' was trained on different classes than the labels "
                                  f"table data.labels '{table}' has now ({detail}). Use the table as it was "
                                  "when trained, or start a new run.")
        raise CheckpointError(f"checkpoint '{path}' was trained on different classes than data.data_dir "
                              f"has ({detail}). Use the data folder it was trained on, or start a new run.")


def refuse_split_changes(data: Namespace, ckpt: str | Path) -> None:
    """A drawn split follows its settings: continued or tested with others, a run would train on
    its test images or score its training images. One line naming each, before any work."""
    drawn = (read_checkpoint(ckpt, mmap=True).get("FolderDataModule") or {}).get("split") or {}
    changed = [f"data.{k}={data.get(k)} (drawn with {v})" for k, v in drawn.items() if data.get(k) != v]
    if changed:
        raise CheckpointError(f"checkpoint '{ckpt}' was trained on a split drawn with other settings: "
                              f"{'; '.join(changed)} would mix its training images into val/test; leave "
                              "them as they were, or start a new run (model.weights=CKPT takes its weights)")


def known_settings(stored: dict, cls: type, path: str | Path, what: str) -> dict:
    """The stored settings ``cls`` takes; the others are named in a notice (a setting that silently
    vanished misleads). Lightning's own keys (``_instantiator``) are left out without a word."""
    allowed = inspect.signature(cls.__init__).parameters
    stored = {k: v for k, v in stored.items() if not k.startswith("_")}
    unknown = sorted(set(stored) - set(allowed))
    if unknown:
        log.warning("Notice: '%s' holds %s this version does not know, left out: %s", path, what,
                    ", ".join(unknown))
    return {k: v for k, v in stored.items() if k in allowed}


def datamodule_for(ckpt_path: str | Path, model, data_dir: str | None = None):
    """The run's data module, rebuilt from the settings the checkpoint stored (``data_dir``
    overrides its folder), with the model's preprocessing and no cache (one pass)."""
    from project.data import FolderDataModule

    stored = dict(read_checkpoint(ckpt_path, mmap=True).get("datamodule_hyper_parameters") or {})
    settings = known_settings(stored, FolderDataModule, ckpt_path, "data settings")
    settings["data_dir"] = data_dir or settings.get("data_dir")
    if not settings["data_dir"]:
        raise CheckpointError(f"'{ckpt_path}' does not say which data it was trained on: pass --data_dir DIR")
    check_trained_data_dir(ckpt_path, settings["data_dir"], "--data_dir ", given=data_dir is not None)
    return FolderDataModule(**{**settings, "cache": "none", "preprocessing": model.preprocessing,
                               "unlabeled": None})  # training's alone (the folder may be gone)


def check_trained_data_dir(ckpt_path: str | Path, data_dir: str, option: str, given: bool = False) -> None:
    """The folder a checkpoint's run was trained on, gone (moved, or another machine): one line
    saying how to point the command at its new place (``option``: the command's setting for it,
    as written before the value)."""
    if given or "://" in data_dir or Path(data_dir).expanduser().exists():
        return
    raise CheckpointError(f"'{ckpt_path}' was trained on the images in '{data_dir}', which is not there "
                          f"now (moved, or another machine): pass their new place, {option}NEW_FOLDER")


def check_data_dir(data_dir: str | None) -> None:
    """A command's ``--data_dir`` that is not a folder: one line before any model is loaded."""
    if data_dir and "://" not in data_dir and not Path(data_dir).expanduser().is_dir():
        raise ConfigError(f"--data_dir '{data_dir}' is not a folder: pass the images' folder")


def refuse_model_changes(asked: Namespace, kept: Namespace, ckpt: str, given: set[str]) -> None:
    """A run continued from a checkpoint keeps the model, optimiser and schedule it was trained
    with (Lightning reads them from the checkpoint over the config): a model setting the command
    line (``given``) asks for otherwise is refused, not silently dropped."""
    from project.common.argv import leaves

    wanted, trained = leaves(asked.as_dict()), leaves(kept.as_dict())
    changed = [f"model.{k}={wanted[k]} (it has {trained[k]})" for k in sorted(wanted)  # None: auto
               if k in trained and wanted[k] is not None and wanted[k] != trained[k]
               and any(k == g or k.startswith(f"{g}.") for g in given)]
    if changed:
        raise ConfigError(f"checkpoint '{ckpt}' continues the model it was trained with, so "
                          f"{'; '.join(changed)} would be ignored: drop the setting (the run's own "
                          "config.yaml has the trained ones), or start a new run without --ckpt_path "
                          "(model.weights=PATH starts from a checkpoint's weights)")
