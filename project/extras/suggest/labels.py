"""The round trip: the rows of ``to_label.csv`` whose ``label`` a person filled, appended to the
labels table that ``data.labels`` reads (``project/data/tables.py``).

Image paths are written relative to ``data_dir`` (by default the table's own folder) when they
lie below it, as the table reader expects, else absolute (``data_dir / absolute`` is the
absolute path). A row for an image the table already lists with a label is skipped, so adding
twice is safe; one it lists without a label (an unlabeled image) gets the label.
"""

from __future__ import annotations

import csv
import io
import os
from dataclasses import dataclass, field
from pathlib import Path

from project.common.files import write_text
from project.errors import ProjectError
from project.tasks.labels import split_labels


@dataclass
class Added:
    """What :func:`add_labels` did: rows added, rows skipped (already in the table), rows still
    without a label, and label names neither the table nor the model's suggestions know."""

    added: int = 0
    skipped: int = 0
    unlabeled: int = 0
    filled: int = 0  # of ``added``: rows the table listed without a label
    new_classes: list[str] = field(default_factory=list)


def read_rows(path: Path) -> tuple[list[str], list[dict]]:
    """(columns, rows) of a CSV file, with an error naming it when it cannot be read."""
    try:
        with open(path, newline="", encoding="utf-8-sig") as f:
            reader = csv.DictReader(f)
            rows = list(reader)
            return [c.strip() for c in reader.fieldnames or []], [
                {(k or "").strip(): (v or "").strip() if isinstance(v, str) else "" for k, v in r.items()}
                for r in rows]
    except (OSError, UnicodeDecodeError) as err:
        raise ProjectError(f"cannot read '{path}' as a CSV table ({type(err).__name__}: {err})") from err


def table_path(image: str, data_dir: Path) -> str:
    """``image`` relative to ``data_dir`` when below it (with ``/``), else absolute."""
    absolute = Path(os.path.abspath(image))
    root = Path(os.path.abspath(data_dir))
    try:
        return absolute.relative_to(root).as_posix()
    except ValueError:
        return str(absolute)


def add_labels(to_label: str | Path, labels: str | Path, data_dir: str | Path | None = None) -> Added:
    """Append the labeled rows of ``to_label`` to the table ``labels`` (created with a header when
    missing; its own label column, ``label`` or ``labels``, is kept)."""
    to_label, labels = Path(to_label), Path(labels)
    if not to_label.is_file():
        raise ProjectError(f"--add '{to_label}' does not exist (python -m project suggest writes it)")
    columns, rows = read_rows(to_label)
    if not {"image", "label"} <= set(columns):
        raise ProjectError(f"--add '{to_label}' has columns {columns}; expected image,label,... as "
                           "python -m project suggest writes it")
    root = Path(data_dir) if data_dir is not None else labels.parent
    header, existing = (read_rows(labels) if labels.is_file() else (["image", "label"], []))
    label_col = "labels" if "labels" in header else "label"
    if "image" not in header or label_col not in header:
        raise ProjectError(f"--labels '{labels}' has columns {header}; --add writes tables of image,label "
                           "(or image,labels)")
    where_of = {os.path.normpath(os.path.join(root, r.get("image", ""))): r for r in existing}
    known = {n for r in existing for n in split_labels(r.get(label_col, ""), label_col == "labels")}
    known |= {r.get("suggested", "") for r in rows}
    result, appended = Added(), []
    for r in rows:
        if not r.get("label"):
            result.unlabeled += 1
            continue
        image = table_path(r["image"], root)
        where = os.path.normpath(os.path.join(root, image))
        listed = where_of.get(where)
        if listed is not None and listed.get(label_col):
            result.skipped += 1
            continue
        names = split_labels(r["label"], label_col == "labels")
        result.new_classes += [n for n in names if n not in known and n not in result.new_classes]
        if listed is not None:  # a row without a label (an unlabeled image of the table): filled in
            listed[label_col] = r["label"]
            result.filled += 1
        else:
            where_of[where] = {c: "" for c in header} | {"image": image, label_col: r["label"]}
            appended.append(where_of[where])
        result.added += 1
    if result.added:
        write_table(labels, header, existing, appended, rewrite=result.filled > 0)
    return result


def write_table(path: Path, header: list[str], existing: list[dict], appended: list[dict],
                rewrite: bool) -> None:
    """Append ``appended`` to the table's text as it is; ``rewrite``: write every row again (an
    existing row changed)."""
    lines = io.StringIO()
    writer = csv.DictWriter(lines, fieldnames=header, lineterminator="\n", extrasaction="ignore")
    if rewrite or not path.is_file():
        writer.writeheader()
        writer.writerows(existing if rewrite else [])
        before = ""
    else:
        before = path.read_text(encoding="utf-8-sig")
        before += "\n" if before and not before.endswith("\n") else ""
    writer.writerows(appended)
    write_text(path, before + lines.getvalue())
