"""Where the embedding commands get their network (a checkpoint, or a config's pretrained backbone)
and their labeled images (the checkpoint's data set, a config's, or a folder given): one reader
for embed, probe, suspects and check-data."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

import torch
import yaml

from project.common.options import device, positive_int
from project.errors import ConfigError, ProjectError
from project.extras.embeddings.cache import CACHE_ROOT, Network, identity_of

log = logging.getLogger("project")


def add_network_args(p: argparse.ArgumentParser, config: bool = True) -> None:
    p.add_argument("--ckpt_path", help="the network: a .ckpt, a run folder, best or last (default: the "
                                       "newest run's best)")
    if config:
        p.add_argument("--config", help="the network: this config's model.backbone and model.weights "
                                        "(pretrained, not fine-tuned), instead of a checkpoint")
    p.add_argument("--cache", default=str(CACHE_ROOT), help="folder of the embedding cache")
    p.add_argument("--batch_size", type=positive_int, default=64)
    p.add_argument("--num_workers", type=int, default=0)
    p.add_argument("--device", type=device, default="cuda" if torch.cuda.is_available() else "cpu")


def network_from_checkpoint(spec: str | None) -> tuple[Network, Path]:
    """A trained checkpoint (``--ckpt_path``; None: the newest run's best) as the network."""
    from project.checkpoints import file_sha256, load_model
    from project.runs import resolve_checkpoint

    ckpt = resolve_checkpoint(spec)
    model = load_model(ckpt)
    identity = identity_of(model, f"checkpoint sha256 {file_sha256(ckpt)}")
    return Network(model, identity, f"checkpoint {ckpt}"), ckpt


def read_config(path: str | Path) -> dict:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"--config '{path}' is not a file: pass a config such as configs/train.yaml")
    try:
        config = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as err:
        raise ConfigError(f"--config '{path}' is not valid YAML ({str(err).splitlines()[0]})") from None
    if not isinstance(config, dict):
        raise ConfigError(f"--config '{path}' holds no settings (expected model: and data: groups)")
    return config


def network_from_config(path: str | Path) -> Network:
    """The config's ``model.backbone`` with its ``model.weights`` (pretrained features, no fine-tuning).
    A network without real weights (``weights: null``, or weights that could not be loaded offline)
    is refused: its embeddings would mean nothing."""
    from project.checkpoints import file_sha256
    from project.model import ImageClassifier
    from project.model.sources import is_file, is_scratch

    settings = dict(read_config(path).get("model") or {})
    backbone, weights = settings.get("backbone", "resnet18"), settings.get("weights", "DEFAULT")
    if is_scratch(weights):
        raise ConfigError(f"--config '{path}': model.weights is null, a random network whose embeddings mean "
                          "nothing; set model.weights (DEFAULT: ImageNet) or pass --ckpt_path")
    # two classes: the new head is never read (gives_logits=False), and the metrics refuse one
    model = ImageClassifier(num_classes=2, backbone=backbone, weights=weights,
                            input=settings.get("input") or {}, head=settings.get("head") or "linear")
    if not model.pretrained:
        raise ConfigError(f"--config '{path}': model.weights={weights} could not be loaded "
                          f"({model.weights_note}); embeddings of random weights mean nothing: put the "
                          "weights where it says, or pass --ckpt_path")
    source = f"file sha256 {file_sha256(weights)}" if is_file(str(weights)) else f"name {weights}"
    return Network(model.eval(), identity_of(model, source), f"{backbone} ({weights}) of {path}",
                   gives_logits=False)


def network_from_args(a: argparse.Namespace) -> tuple[Network, Path | None]:
    """(network, its checkpoint or None) from ``--ckpt_path`` / ``--config``."""
    config = getattr(a, "config", None)
    if config and a.ckpt_path:
        raise ConfigError("pass --ckpt_path or --config, not both: the embeddings come from one network")
    if config:
        return network_from_config(config), None
    return network_from_checkpoint(a.ckpt_path)


def labeled_splits(ckpt: Path | None, network: Network | None, data_dir: str | None = None,
                   labels: str | None = None, config: str | None = None):
    """The labeled images (``FolderSplits``): ``data_dir``/``labels`` when given, split as the
    checkpoint's (or config's) data settings say; else the checkpoint's or config's own data set."""
    from project.data.folders import discover
    from project.data.tables import discover_table

    if data_dir and not Path(data_dir).is_dir():
        raise ProjectError(f"--data_dir '{data_dir}' is not a folder: pass the folder of the images")
    if ckpt is not None and not labels:
        from project.checkpoints import datamodule_for

        return datamodule_for(ckpt, network.model, data_dir).splits
    data = data_settings(ckpt, config)
    data_dir = data_dir or data.get("data_dir")
    labels = labels or data.get("labels")
    if not data_dir:
        raise ProjectError("which images? pass --data_dir DIR (and --labels CSV for a labels table)")
    split = split_args(data)
    if labels:
        return discover_table(labels, data_dir, data.get("task") or "auto", **split)
    return discover(data_dir, **split)


SPLIT_ARGS = {"val_fraction": "val_fraction", "test_fraction": "test_fraction", "split_seed": "seed"}


def split_args(data: dict) -> dict:
    """The split settings of data settings (``data_settings``), as ``discover``'s arguments."""
    return {arg: data[key] for key, arg in SPLIT_ARGS.items() if data.get(key) is not None}


def data_settings(ckpt: Path | None, config: str | None) -> dict:
    """The data settings the run was trained with (its checkpoint's), else the config's."""
    if ckpt is not None:
        from project.checkpoints import read_checkpoint

        return dict(read_checkpoint(ckpt, mmap=True).get("datamodule_hyper_parameters") or {})
    return dict(read_config(config).get("data") or {}) if config else {}
