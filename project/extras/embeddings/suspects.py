"""``suspects --method embeddings``: out-of-fold probabilities from a linear classifier on the
cached embeddings, instead of K fine-tunes: seconds once the images are embedded."""

from __future__ import annotations

import argparse
import logging

import torch

from project.errors import ConfigError
from project.extras.embeddings.cache import embed
from project.extras.embeddings.linear import out_of_fold, single_labels
from project.extras.embeddings.sources import add_network_args, labeled_splits, network_from_args

log = logging.getLogger("project")


def embedding_suspects(argv: list[str], folds: int, seed: int):
    """(training samples, class names, out-of-fold probabilities, fold of each sample, the
    network's preprocessing, how they were judged): what suspects ranks and draws."""
    argv, config = first_config(list(argv))
    p = argparse.ArgumentParser(prog="python -m project suspects --method embeddings")
    add_network_args(p, config=False)
    p.add_argument("--data_dir", "--data.data_dir", dest="data_dir", help="the labeled images")
    p.add_argument("--labels", "--data.labels", dest="labels", help="their labels table")
    a, rest = p.parse_known_args(argv)
    a.config = config
    if rest:
        log.info("Notice: --method embeddings fits no model, so these settings do nothing: %s "
                 "(they are for --method refit)", " ".join(rest))
    if config and a.ckpt_path:
        raise ConfigError("pass --ckpt_path or --config, not both: the embeddings come from one network")
    splits = labeled_splits(None, None, a.data_dir, a.labels, config) if config else None  # data first
    network, ckpt = network_from_args(a)
    splits = splits or labeled_splits(ckpt, network, a.data_dir, a.labels, config)
    if not splits.train:
        raise ConfigError("suspects: the data set has no training images")
    single_labels(splits.train, "suspects")  # before the embedding pass: another task's labels are refused
    done = embed([s.path for s in splits.train], network, a.cache, a.batch_size, a.device, a.num_workers)
    if done.skipped:
        log.info("Notice: %d training images could not be decoded and are not ranked "
                 "(python -m project check-data lists them)", len(done.skipped))
    kept = set(done.paths)
    row = {p: i for i, p in enumerate(done.paths)}
    samples = [s for s in splits.train if s.path in kept]
    features = done.features[[row[s.path] for s in samples]]
    probs, fold_of = out_of_fold(features, samples, len(splits.classes), folds, seed)
    return (samples, list(splits.classes), torch.from_numpy(probs), fold_of, network.model.preprocessing,
            f"a linear model on embeddings, {folds} folds")


def first_config(argv: list[str]) -> tuple[list[str], str | None]:
    """``argv`` without its first ``--config FILE`` and that file (refit's main config names the
    network here; a preset after it is for refit, and the notice says so)."""
    for i, arg in enumerate(argv):
        if arg == "--config" and i + 1 < len(argv):
            return argv[:i] + argv[i + 2:], argv[i + 1]
        if arg.startswith("--config="):
            return argv[:i] + argv[i + 1:], arg.split("=", 1)[1]
    return argv, None
