"""check-data's look through a network's eyes: near-duplicates (resized, cropped, re-encoded copies
the byte check misses) within and across splits, the images least like their class, and the
classes most alike. Runs when a network is given (``--ckpt_path``, ``--config``) or a run exists."""

from __future__ import annotations

import argparse
import csv
import logging
import shlex
from pathlib import Path

import numpy as np

from project.common.files import atomic_path, list_images
from project.data.folders import DataFolderError
from project.errors import ProjectError
from project.extras.embeddings.cache import embed
from project.extras.embeddings.copies import agreement
from project.extras.embeddings.neighbours import likeness_to_class, look_alike_classes, near_pairs
from project.extras.embeddings.sources import add_network_args, data_settings, network_from_args, split_args

log = logging.getLogger("project")
# the defaults of --near and --pixels: benchmarks/embeddings.py (MNIST at 64 px, ImageNet
# efficientnet_lite0, planted resized, cropped and JPEG re-uploads; docs/analysis.md, "Embeddings once")
NEAR = 0.90  # cosine: every planted re-upload passed, among tens of thousands of look-alikes
PIXELS = 0.99  # aligned grey pixels: every re-upload 0.993 or more, 14 look-alike pairs of 36,644
FIELDS = ("image_a", "image_b", "similarity", "split_a", "split_b", "pixels")  # near_duplicates.csv
SHEET_PAIRS = 12  # pairs on near_duplicates.png
SHOWN = 5  # lines of each list printed
Labeled = tuple[str, str, str]  # (split, label, path)


def add_args(p: argparse.ArgumentParser) -> None:
    add_network_args(p)
    p.add_argument("--near", type=float, default=NEAR,
                   help="cosine similarity of embeddings above which two images are compared pixel by pixel")
    p.add_argument("--pixels", type=float, default=PIXELS,
                   help="correlation of the aligned grey pixels above which such a pair is one picture "
                        "(0: every pair above --near, look-alikes included)")
    p.add_argument("--out", default="logs/check-data", help="folder for near_duplicates.csv/.png, "
                                                            "outliers.csv, look_alikes.csv")
    p.add_argument("--drop-leaks", dest="drop_leaks", action="store_true",
                   help="write labels_without_leaks.csv: every image but the training copies of leaks")


def wanted(a: argparse.Namespace) -> bool:
    """A network given, or a run to take one from: check-data on a fresh folder stays as it was."""
    from project.runs import run_dirs

    return bool(a.ckpt_path or a.config or run_dirs())


def labeled_images(a: argparse.Namespace, ckpt: Path | None) -> tuple[list[Labeled], bool, str]:
    """((split, label, path) of every image, whether each has one class, a notice), split as
    training splits the folder or table given (the checkpoint's or config's split settings, not its
    data); data whose splits cannot be made (a missing image, a class missing from val/) keeps the
    splits it states, the rest as train, so the check still runs."""
    from project.data.folders import discover
    from project.data.tables import discover_table

    split = split_args(data_settings(ckpt, getattr(a, "config", None)))
    try:
        splits = (discover_table(a.labels, a.data_dir, "auto", **split) if a.labels
                  else discover(a.data_dir, **split))
    except DataFolderError as err:
        return stated_splits(a.data_dir, a.labels), True, f"  (splits as the data states them: {err})"
    samples = [(name, s) for name in ("train", "val", "test") for s in getattr(splits, name)]
    one_class = all(isinstance(s.label, int) for _, s in samples)  # a class index; else a task's encoding
    return [(name, splits.classes[s.label] if one_class else str(s.label), s.path)
            for name, s in samples], one_class, ""


def stated_splits(data_dir: str, labels: str | None) -> list[Labeled]:
    """The splits a folder's split folders or a table's split column state (else train)."""
    root = Path(data_dir)
    if labels:
        from project.data.tables import read_table

        table = read_table(labels, data_dir)
        return [(r.split or "train", table.labels.text(r.label), str(root / r.image)) for r in table.rows
                if (root / r.image).is_file() and r.label is not None]  # an empty label: no class
    from project.data.folders import layout

    base, classes, splits = layout(root)
    return [(split, cls, p) for split, folder in {"train": base, **splits}.items() for cls in classes
            for p in list_images(folder / cls)]


def write_csv(path: Path, fields: list[str], rows: list[dict]) -> None:
    with atomic_path(path) as tmp, open(tmp, "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=fields)
        writer.writeheader()
        writer.writerows(rows)


def check_args(a: argparse.Namespace) -> None:
    """Before the scan: a wrong threshold is one line, not the end of a long run."""
    if not 0 < a.near <= 1:
        raise ProjectError(f"--near must be a cosine similarity in (0, 1], got {a.near}")
    if not 0 <= a.pixels <= 1:
        raise ProjectError(f"--pixels must be a correlation in [0, 1], got {a.pixels}")


def report(a: argparse.Namespace) -> str:
    """The section check-data prints (files written to ``--out``; an earlier run's that this one
    does not write are removed); a notice instead when the network was not asked for and cannot
    be loaded. ``check_args`` has passed."""
    try:
        network, ckpt = network_from_args(a)
    except ProjectError as err:
        if a.ckpt_path or a.config:
            raise
        return f"Notice: no near-duplicate check: the newest run's network does not load ({err})"
    images, classes, fallback = labeled_images(a, ckpt)
    if not images:
        return ""
    done = embed([p for _, _, p in images], network, a.cache, a.batch_size, a.device, a.num_workers)
    of = {p: (split, label) for split, label, p in images}
    paths = done.paths
    name = {p: Path(p).relative_to(a.data_dir).as_posix() if Path(p).is_relative_to(a.data_dir) else p
            for p in paths}
    out = Path(a.out)
    lines = [f"NEAR-DUPLICATES AND OUTLIERS (embeddings of {network.described}; {done.computed} of "
             f"{len(paths)} images embedded now, {len(done.skipped)} undecodable left out):"]
    lines += [fallback] if fallback else []
    i, j, s, truncated = near_pairs(done.features, a.near)
    alike = agreement([(paths[x], paths[y]) for x, y in zip(i, j, strict=True)])
    keep = alike >= a.pixels
    i, j, s, alike = i[keep], j[keep], s[keep], alike[keep]
    pairs = [dict(zip(FIELDS, (name[paths[x]], name[paths[y]], f"{v:.4f}", of[paths[x]][0], of[paths[y]][0],
                               f"{c:.4f}"), strict=True)) for x, y, v, c in zip(i, j, s, alike, strict=True)]
    write_csv(out / "near_duplicates.csv", list(FIELDS), pairs)
    leaks = [r for r in pairs if r["split_a"] != r["split_b"]]
    more = " (the closest only: raise --near)" if truncated else ""
    alike_only = f", {int((~keep).sum())} more as close but other pictures (look-alikes)" if a.pixels else ""
    lines.append(f"  {len(pairs)} pairs above cosine {a.near} and pixel correlation {a.pixels}{more}"
                 f"{alike_only}: {len(leaks)} across splits (leaks: the copy's score measures memory), "
                 f"{len(pairs) - len(leaks)} within a split -> {out / 'near_duplicates.csv'}")
    lines += [f"    {r['similarity']}  {r['image_a']} ({r['split_a']})  ~  {r['image_b']} ({r['split_b']})"
              for r in (leaks or pairs)[:SHOWN]]
    if pairs:
        sheet(done, i, j, s, network.model.preprocessing, out / "near_duplicates.png", name)
        lines.append(f"  the {min(SHEET_PAIRS, len(pairs))} closest pairs: {out / 'near_duplicates.png'}")
    if a.drop_leaks:
        lines.append(drop_leaks(a, leaks, images, out / "labels_without_leaks.csv"))
    labels = [of[p][1] for p in paths]
    stale = {"near_duplicates.png": not pairs, "outliers.csv": not classes or len(set(labels)) < 2}
    stale["look_alikes.csv"] = stale["outliers.csv"]
    for file in (n for n, gone in stale.items() if gone):  # an earlier run's would pass for this one's
        (out / file).unlink(missing_ok=True)
    if not classes:
        lines.append("  (outliers and look-alike classes are for one class per image; these labels are not)")
    elif len(set(labels)) > 1:
        lines += outliers_and_look_alikes(done.features, labels, [name[p] for p in paths],
                                          [of[p][0] for p in paths], out)
    return "\n".join(lines)


def outliers_and_look_alikes(features: np.ndarray, labels: list[str], names: list[str], splits: list[str],
                             out: Path) -> list[str]:
    likeness = likeness_to_class(features, labels)
    order = np.argsort(likeness, kind="stable")
    write_csv(out / "outliers.csv", ["image", "label", "split", "likeness"],
              [{"image": names[k], "label": labels[k], "split": splits[k], "likeness": f"{likeness[k]:.4f}"}
               for k in order])
    alike = look_alike_classes(features, labels)
    write_csv(out / "look_alikes.csv", ["class_a", "class_b", "similarity"],
              [{"class_a": x, "class_b": y, "similarity": f"{v:.4f}"} for x, y, v in alike])
    lines = [f"  least like their class (cosine to the class's mean embedding; a wrong label or an odd "
             f"image?) -> {out / 'outliers.csv'}"]
    lines += [f"    {likeness[k]:.4f}  {names[k]} ({labels[k]})" for k in order[:SHOWN]]
    lines.append(f"  classes most alike (their mean embeddings; more examples of each helps) "
                 f"-> {out / 'look_alikes.csv'}")
    lines += [f"    {v:.4f}  {x} ~ {y}" for x, y, v in alike[:SHOWN]]
    return lines


def sheet(done, i, j, s, pre, path: Path, name: dict) -> None:
    """near_duplicates.png: the closest pairs side by side, each titled with its similarity."""
    import torch

    from project.data.datasets import ImageDataset
    from project.data.folders import Sample
    from project.data.images import needed_side
    from project.data.transforms import eval_transforms
    from project.extras.analysis.plots import denormalise, grid_figure, save

    shown = list(zip(i[:SHEET_PAIRS], j[:SHEET_PAIRS], s[:SHEET_PAIRS], strict=True))
    paths = [done.paths[k] for x, y, _ in shown for k in (x, y)]
    dataset = ImageDataset([Sample(p, 0) for p in paths], eval_transforms(pre), short_side=needed_side(pre))
    images, titles = [], []
    for n, (_x, _y, v) in enumerate(shown):
        a, b = dataset[2 * n], dataset[2 * n + 1]
        if a is None or b is None:
            continue
        images += [a[0], b[0]]
        titles += [f"{v:.3f}\n{name[paths[2 * n]][-22:]}", f"~\n{name[paths[2 * n + 1]][-22:]}"]
    if images:
        grid = denormalise(torch.stack(images), pre.mean, pre.std)
        title = "closest pairs of images (cosine similarity of embeddings)"
        save(grid_figure(grid, titles, title, cols=4), path)


def drop_leaks(a: argparse.Namespace, leaks: list[dict], images: list[tuple[str, str, str]],
               path: Path) -> str:
    """A labels table of every image but the training member of each leak pair; with ``--labels``,
    that table's rows (all its columns) less those images."""
    root = Path(a.data_dir)
    dropped = {r["image_a"] if r["split_a"] == "train" else r["image_b"] for r in leaks
               if "train" in (r["split_a"], r["split_b"])}
    if a.labels:
        with open(a.labels, newline="", encoding="utf-8") as f:
            reader = csv.DictReader(f)
            fields, rows = list(reader.fieldnames or []), list(reader)
        rows = [r for r in rows if Path(r["image"]).as_posix() not in dropped]
    else:
        fields = ["image", "label", "split"]
        rows = [{"image": Path(p).relative_to(root).as_posix(), "label": label, "split": split}
                for split, label, p in images]
        rows = [r for r in rows if r["image"] not in dropped]
    write_csv(path, fields, rows)
    return (f"  {len(dropped)} training copies of leaks left out of {path} ({len(rows)} rows): train with "
            f"{shlex.quote(f'--data.labels={path}')} {shlex.quote(f'--data.data_dir={a.data_dir}')}")
