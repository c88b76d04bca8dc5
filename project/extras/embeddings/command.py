"""``python -m project embed`` fills the embedding cache; ``python -m project probe`` fits a linear
classifier on the frozen embeddings of the run's data and scores it beside the fine-tuned model.

    python -m project embed DATA_DIR [--labels CSV] [--ckpt_path CKPT|RUN | --config FILE]
    python -m project probe [--ckpt_path CKPT|RUN | --config FILE --data_dir DIR] [--out DIR]

A probe that scores near the fine-tuned model says the backbone's features already separate the
classes (fine-tuning bought little); far below it, fine-tuning earned its cost.
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from pathlib import Path

import numpy as np

from project.common.files import list_images, write_text
from project.errors import ProjectError
from project.extras.embeddings.cache import Embedded, embed
from project.extras.embeddings.sources import add_network_args, labeled_splits, network_from_args

log = logging.getLogger("project")


def embed_main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m project embed",
                                description="Compute the embeddings of a data folder once, into the cache "
                                            "that probe, suspects, check-data and suggest read")
    p.add_argument("data_dir", help="a folder of images (any layout)")
    p.add_argument("--labels", help="a labels table: embed only the images it names")
    add_network_args(p)
    a = p.parse_args(argv)
    if not Path(a.data_dir).is_dir():
        raise ProjectError(f"'{a.data_dir}' is not a folder: pass the data folder")
    if a.labels:
        from project.data.tables import read_table

        paths = [str(Path(a.data_dir) / r.image) for r in read_table(a.labels, a.data_dir).rows]
    else:
        paths = list_images(a.data_dir)
    if not paths:
        raise ProjectError(f"no image files in '{a.data_dir}'")
    rank = join_process_group(a)
    network, _ = network_from_args(a)
    start = time.perf_counter()
    done = embed(paths, network, a.cache, a.batch_size, a.device, a.num_workers)
    if rank == 0:
        print(summary(done, len(paths), time.perf_counter() - start))
    return 0


def join_process_group(a: argparse.Namespace) -> int:
    """Under torchrun (WORLD_SIZE > 1), join its process group, each rank on its own GPU where there
    are GPUs: embed then computes a share on each. This process's rank (0 alone)."""
    import os

    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return 0
    import torch
    import torch.distributed as dist

    gpu = torch.cuda.is_available() and a.device in (None, "cuda")
    if gpu:
        a.device = f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}"
    dist.init_process_group("nccl" if gpu else "gloo")
    return dist.get_rank()


def summary(done: Embedded, total: int, seconds: float) -> str:
    skipped = f", {len(done.skipped)} skipped (unreadable or not an image)" if done.skipped else ""
    dims = done.features.shape[1] if done.features.size else 0
    return (f"{len(done.paths)} of {total} images embedded ({dims} values each): {done.computed} computed, "
            f"{len(done.paths) - done.computed} from the cache{skipped}; {seconds:.1f} s -> {done.folder}")


def run_folder(ckpt: Path) -> Path:
    """The run a checkpoint belongs to (``<run>/checkpoints/<file>``), else its folder."""
    return ckpt.parent.parent if ckpt.parent.name == "checkpoints" else ckpt.parent


def probe_main(argv: list[str]) -> int:
    import torch

    from project import tasks
    from project.extras.embeddings.linear import fit_linear

    p = argparse.ArgumentParser(prog="python -m project probe",
                                description="A linear classifier on the frozen embeddings of the run's "
                                            "data: train fits it, val and test score it")
    add_network_args(p)
    p.add_argument("--data_dir", help="the data (default: the checkpoint's, or the config's data.data_dir)")
    p.add_argument("--labels", help="a labels table of --data_dir")
    p.add_argument("--l2", type=float, default=1e-2, help="weight decay of the linear classifier")
    p.add_argument("--out", help="folder for probe.json (default: the run folder)")
    a = p.parse_args(argv)
    splits = labeled_splits(None, None, a.data_dir, a.labels, a.config) if a.config else None  # data first
    network, ckpt = network_from_args(a)
    splits = splits or labeled_splits(ckpt, network, a.data_dir, a.labels, a.config)
    parts = {"train": splits.train, "val": splits.val, "test": splits.test}
    if not parts["train"] or not (parts["val"] or parts["test"]):
        raise ProjectError("probe needs training images and val or test images to score it")
    paths = [s.path for v in parts.values() for s in v]
    done = embed(paths, network, a.cache, a.batch_size, a.device, a.num_workers)
    row = {p: i for i, p in enumerate(done.paths)}
    # the task's own loss, targets and score: accuracy, mAP, MAE, ... as export compares formats by
    task_class, n = tasks.task_class(splits.task), len(splits.classes)
    stats = task_class.summarise_labels([s.label for s in splits.train], n)
    task = task_class(splits.classes, label_stats=stats)
    metric, score = task.export_score()
    metric = metric.removeprefix("val_")
    scores: dict = {"network": network.described, "classes": n, "metric": metric,
                    "skipped": len(done.skipped), "checkpoint": ckpt.name if ckpt else None}
    own_classes = list(getattr(network.model, "class_names", [])) == list(splits.classes)
    probe = None
    for name, samples in parts.items():
        keep = [i for i, s in enumerate(samples) if s.path in row]
        x = done.features[[row[samples[i].path] for i in keep]] if keep else np.zeros((0, 0))
        y = torch.stack([torch.as_tensor(task.target(samples[i].label)) for i in keep]) if keep else None
        if name == "train":
            probe = fit_linear(x, y, n, a.l2, loss=task.loss)
            scores["train_images"] = len(keep)
            continue
        scores[f"{name}_images"] = len(keep)
        scores[f"{name}_{metric}_probe"] = score(probe.logits(x), y) if keep else None
        if done.logits is not None and own_classes and keep:  # the data of the network's own classes
            logits = torch.as_tensor(done.logits[[row[samples[i].path] for i in keep]])
            scores[f"{name}_{metric}_finetuned"] = score(logits, y)
    out = Path(a.out) if a.out else run_folder(ckpt) if ckpt is not None else Path("logs/probe")
    write_text(out / "probe.json", json.dumps(scores, indent=1))
    print(f"Linear probe on the frozen embeddings of {network.described} "
          f"({scores['train_images']} training images, {done.computed} embedded now):")
    for name in ("val", "test"):
        if scores.get(f"{name}_{metric}_probe") is None:
            continue
        tuned = scores.get(f"{name}_{metric}_finetuned")
        beside = f" (fine-tuned model: {tuned:.4f})" if tuned is not None else ""
        print(f"  {name} {metric}: {scores[f'{name}_{metric}_probe']:.4f} on {scores[f'{name}_images']} "
              f"images{beside}")
    print(f"-> {out / 'probe.json'}")
    return 0
