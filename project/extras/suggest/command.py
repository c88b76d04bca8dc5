"""Which unlabeled images to label next, and the labels a person gives them back into the table.

    python -m project suggest --unlabeled DIR [--strategy margin-kcenter] [--n 100] [--out DIR]
    python -m project suggest --add to_label.csv --labels LABELS.csv

The first ranks the images below ``DIR`` with the newest run's best checkpoint (``--ckpt_path``
overrides) and writes ``to_label.csv`` (image, label, suggested, score, rank: ``label`` is the
person's to fill) and ``to_label.png`` (the ranked images, captioned) to ``--out``, by default
``<run folder>/suggest/``. The second appends the rows whose ``label`` was filled to the labels
table that ``data.labels`` reads. docs/fewer-labels.md explains the strategies.
"""

from __future__ import annotations

import argparse
import logging
import os
import shlex
from pathlib import Path

import torch

from project.common.files import list_images
from project.common.options import device, positive_int
from project.errors import ProjectError
from project.extras.suggest.rank import STRATEGIES, check_strategy, rank_pool

log = logging.getLogger("project")
SHOWN_SKIPPED = 3  # undecodable files named in the one line that counts them


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m project suggest", description=__doc__.split("\n")[0])
    p.add_argument("--unlabeled", help="a folder of images without labels (any layout)")
    p.add_argument("--strategy", default="margin-kcenter", help=f"one of {', '.join(STRATEGIES)}")
    p.add_argument("--n", type=int, default=100, help="how many images to suggest")
    p.add_argument("--out", help="folder for to_label.csv and .png (default: <run folder>/suggest)")
    p.add_argument("--ckpt_path", default="best", help="a .ckpt, a run folder, best or last")
    p.add_argument("--seed", type=int, default=0, help="seed of --strategy random")
    p.add_argument("--max_labeled", type=int, default=5000,
                   help="k-center: at most this many training images (a seeded sample) to keep away from")
    p.add_argument("--cache", default="logs/embeddings", help="folder of the embedding cache (python -m "
                                                            "project embed fills it)")
    p.add_argument("--batch_size", type=positive_int, default=64)
    p.add_argument("--num_workers", type=int, default=0)
    p.add_argument("--device", type=device, default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--add", metavar="TO_LABEL_CSV", help="append its labeled rows to --labels")
    p.add_argument("--labels", help="with --add: the labels table (image,label) to append to")
    p.add_argument("--data_dir", help="with --add: the folder the table's paths are relative to "
                                      "(default: the table's folder)")
    return p


def main(argv: list[str]) -> int:
    a = parser().parse_args(argv)
    if a.add:
        return add(a)
    if not a.unlabeled:
        raise ProjectError("pass --unlabeled DIR (images to rank) or --add to_label.csv --labels LABELS.csv")
    check_strategy(a.strategy)
    if a.n < 1 or a.max_labeled < 0:
        raise ProjectError(f"--n must be 1 or more and --max_labeled 0 or more, got {a.n} and "
                           f"{a.max_labeled}")
    if not Path(a.unlabeled).exists():
        raise ProjectError(f"--unlabeled '{a.unlabeled}' does not exist")
    if not Path(a.unlabeled).is_dir():
        raise ProjectError(f"--unlabeled '{a.unlabeled}' is a file: --unlabeled takes a folder of images "
                           "(any layout, subfolders searched)")
    paths = [os.path.abspath(p) for p in list_images(a.unlabeled)]
    if not paths:
        raise ProjectError(f"no image files in --unlabeled '{a.unlabeled}'")
    from project.extras.embeddings.sources import network_from_checkpoint
    from project.extras.suggest.pool import embed_pool

    network, ckpt = network_from_checkpoint(a.ckpt_path)
    model = network.model
    check_strategy(a.strategy, model)  # a multi-label or regression model: before any image is read
    data = run_data(ckpt, model)
    splits = data.splits if data is not None else None
    table, data_dir = (data.hparams.labels, str(data.data_dir)) if data is not None else (None, None)
    out = Path(a.out) if a.out else run_folder(ckpt) / "suggest"
    labeled: set[str] = set()
    if splits is not None:
        labeled = {os.path.realpath(s.path) for part in (splits.train, splits.val, splits.test) for s in part}
    keep_filled_labels(out / "to_label.csv", labeled, table, data_dir)  # before it is written anew
    if splits is not None:
        left_out = [p for p in paths if os.path.realpath(p) in labeled]
        paths = [p for p in paths if os.path.realpath(p) not in labeled]
        if left_out:
            print(f"{len(left_out)} of the {len(left_out) + len(paths)} files in --unlabeled are in the "
                  "checkpoint's data set, labeled already: left out")
        if not paths:
            raise ProjectError(f"every image in --unlabeled '{a.unlabeled}' is labeled already")
    pool = embed_pool(model, paths, a.batch_size, a.device, a.num_workers,  # read if k-center asks
                      lambda: training_paths(splits, a.max_labeled, a.seed), network, a.cache)
    if pool.skipped:
        names = ", ".join(Path(p).name for p in pool.skipped[:SHOWN_SKIPPED])
        more = f" and {len(pool.skipped) - SHOWN_SKIPPED} more" if len(pool.skipped) > SHOWN_SKIPPED else ""
        print(f"{len(pool.skipped)} of {len(paths)} files could not be decoded and are not ranked: "
              f"{names}{more}")
    rows = rank_pool(pool, a.strategy, a.n, a.seed)
    from project.extras.suggest.output import write_csv, write_sheet

    write_csv(rows, out / "to_label.csv")
    shown = write_sheet(rows, model.preprocessing, out / "to_label.png", a.strategy)
    print(f"{len(rows)} of {len(pool)} images to label next ({a.strategy}, {ckpt}) -> "
          f"{out / 'to_label.csv'}; {shown} on {out / 'to_label.png'}")
    print(f"Fill the label column, then: {add_command(out / 'to_label.csv', table, data_dir)}")
    return 0


def add_command(to_label: Path, table: str | None, data_dir: str | None) -> str:
    """The ``--add`` command line for ``to_label``: the run's labels table when it has one, with
    ``--data_dir`` when the run's images are not in the table's folder (its paths are relative to
    ``data_dir``, and ``--add`` would otherwise read them against the table's folder)."""
    command = f"python -m project suggest --add {shlex.quote(str(to_label))} --labels "
    if table is None:
        return command + "LABELS.csv"
    command += shlex.quote(str(table))
    local = data_dir and "://" not in data_dir
    if local and os.path.realpath(data_dir) != os.path.realpath(Path(table).parent):
        command += f" --data_dir {shlex.quote(data_dir)}"
    return command


def keep_filled_labels(to_label: Path, labeled: set[str], table: str | None, data_dir: str | None) -> None:
    """A ``to_label.csv`` whose filled labels are not in the run's data yet (``labeled``: its
    images, as real paths; or its labels table), a person's typing, is moved aside to
    ``to_label.filled[-N].csv`` before a new one is written, and the move is said."""
    from project.extras.suggest.labels import labeled_in_table, read_rows

    if not to_label.is_file():
        return
    try:
        _, rows = read_rows(to_label)
    except ProjectError as err:
        raise ProjectError(f"{err}; suggest writes a new one there: move or delete it first") from err
    if table is not None and data_dir and "://" not in data_dir:
        labeled = labeled | labeled_in_table(table, data_dir)
    filled = [r for r in rows if r.get("label") and os.path.realpath(r.get("image", "")) not in labeled]
    if filled:
        names = (to_label.with_name(f"to_label.filled{f'-{n}' if n > 1 else ''}.csv") for n in range(1, 9999))
        kept = next(p for p in names if not p.exists())
        os.replace(to_label, kept)
        print(f"Notice: {to_label} held {len(filled)} filled labels the run's data does not hold yet: "
              f"moved to {kept} (add them: {add_command(kept, table, data_dir)})")


def run_folder(ckpt: Path) -> Path:
    """The run a checkpoint belongs to (``<run>/checkpoints/<file>``), else its folder."""
    return ckpt.parent.parent if ckpt.parent.name == "checkpoints" else ckpt.parent


def run_data(ckpt: Path, model):
    """The checkpoint's data module with its splits read, or None with a notice when they cannot
    be read (moved, or on another machine): nothing is then left out, and k-center keeps the
    suggestions apart from each other only."""
    from project.checkpoints import datamodule_for

    try:
        data = datamodule_for(ckpt, model)
        data.splits  # noqa: B018 (read here: the error below names it)
        return data
    except (ProjectError, OSError) as err:
        log.info("Notice: the checkpoint's data set cannot be read (%s): images labeled already are not "
                 "left out, and k-center keeps the suggestions apart from each other only",
                 str(err).splitlines()[0])
        return None


def training_paths(splits, limit: int, seed: int) -> list[str] | None:
    """The training images (a seeded sample of ``limit``) that k-center keeps away from."""
    if splits is None:
        return None
    paths = [s.path for s in splits.train]
    if len(paths) > limit:
        import numpy as np

        keep = np.random.default_rng(seed).choice(len(paths), size=limit, replace=False)
        paths = [paths[i] for i in sorted(keep)]
    return paths


def add(a: argparse.Namespace) -> int:
    """``--add to_label.csv --labels LABELS.csv``: the round trip's second half."""
    from project.extras.suggest.labels import add_labels

    if not a.labels:
        raise ProjectError("--add needs --labels LABELS.csv: the labels table to append to")
    done = add_labels(a.add, a.labels, a.data_dir)
    filled = f" ({done.filled} of them filled in rows listed without a label)" if done.filled else ""
    print(f"{done.added} rows added to {a.labels}{filled}, {done.skipped} skipped (already there), "
          f"{done.unlabeled} still without a label (in either file)")
    if done.new_classes:
        print(f"Notice: {', '.join(done.new_classes)}: neither in the table nor among the model's "
              "suggestions: a new class, which the next training run adds")
    return 0
