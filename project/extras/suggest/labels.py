"""The round trip: the rows of ``to_label.csv`` whose ``label`` a person filled, appended to the
labels table that ``data.labels`` reads (``project/data/tables.py``).

Image paths are written relative to ``data_dir`` when they lie below it, as the table reader
expects, else absolute (``data_dir / absolute`` is the absolute path). Without ``data_dir`` it is
the table's own folder, unless the table's rows name files below another folder (the one the
answered images show they are relative to). An answer is matched to the table's row of the same
file, however either spells it: a row for an image the table already lists with a label is
skipped, so adding twice is safe; one it lists without a label (an unlabeled image) gets the
label, in the row's own spelling.
"""

from __future__ import annotations

import csv
import io
import os
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from project.common.files import write_text
from project.errors import ProjectError
from project.tasks.labels import label_separator, split_labels


@dataclass
class Added:
    """What :func:`add_labels` did: rows added, rows skipped (already in the table), images still
    without a label (rows of either file), and label names neither the table nor the model's
    suggestions know."""

    added: int = 0
    skipped: int = 0
    unlabeled: int = 0  # distinct images: unanswered in to_label.csv, or listed without a label
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


def same_file(image: str, root: Path) -> str:
    """The file a table path names below ``root`` as the training reader resolves it (``root /
    image``; an absolute path is itself), links followed: one key however a path is spelt."""
    return os.path.realpath(os.path.join(root, image))


ROWS_TRIED = 1000  # rows of the table checked for each folder its paths may be relative to


def table_root(labels: Path, existing: list[dict], answers: list[str]) -> Path:
    """The folder the table's relative paths are relative to, when ``--data_dir`` is not given:
    the table's folder, or a folder that an answered image shows a row is relative to (the image
    ``.../mine/img/a.png`` and the row ``img/a.png``: ``.../mine``), whichever more of the table's
    rows name existing files below (the training reader's ``data.data_dir``)."""
    relative = [r["image"] for r in existing if r.get("image") and not os.path.isabs(r["image"])]
    by_name: dict[str, list[tuple[str, ...]]] = {}
    for image in relative:
        by_name.setdefault(PurePosixPath(image).name, []).append(PurePosixPath(image).parts)
    candidates = [labels.parent]
    for answer in answers:
        parts = Path(os.path.abspath(answer)).parts
        for tail in by_name.get(Path(answer).name, []):
            if len(parts) > len(tail) and parts[-len(tail):] == tail:
                base = Path(*parts[:-len(tail)])
                candidates += [base] if base not in candidates else []
    tried = relative[:ROWS_TRIED]
    return max(candidates, key=lambda base: sum((base / image).is_file() for image in tried))  # ties: first


def labeled_in_table(labels: str | Path, data_dir: str | Path) -> set[str]:
    """The files (as :func:`same_file` keys) the table lists with a label; empty when it cannot be
    read."""
    try:
        header, rows = read_rows(Path(labels))
    except ProjectError:
        return set()
    col = "labels" if "labels" in header else "label"
    return {same_file(r["image"], Path(data_dir)) for r in rows if r.get("image") and r.get(col)}


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
    header, existing = (read_rows(labels) if labels.is_file() else (["image", "label"], []))
    label_col = "labels" if "labels" in header else "label"
    if "image" not in header or label_col not in header:
        raise ProjectError(f"--labels '{labels}' has columns {header}; --add writes tables of image,label "
                           "(or image,labels)")
    answers = [r["image"] for r in rows if r.get("label") and r.get("image")]
    root = Path(data_dir) if data_dir is not None else table_root(labels, existing, answers)
    where_of = {same_file(r["image"], root): r for r in existing if r.get("image")}
    several = label_col == "labels"  # the table's rule for its column (training reads it so)
    sep = label_separator([r.get(label_col) or "" for r in existing] or [r.get("label") or "" for r in rows])
    known = {n for r in existing for n in split_labels(r.get(label_col) or "", several, sep)}
    known |= {r.get("suggested", "") for r in rows}
    result, appended, unanswered = Added(), [], []
    for r in rows:
        if not r.get("label"):
            unanswered += [same_file(r["image"], root)] if r.get("image") else []
            continue
        image = table_path(r["image"], root)
        where = same_file(image, root)
        listed = where_of.get(where)
        if listed is not None and listed.get(label_col):
            result.skipped += 1
            continue
        # an answer's own ';' splits it; written with the table's separator, so no row's meaning moves
        names = split_labels(r["label"], several, ";" if ";" in r["label"] else sep)
        if several and sep == " " and any(" " in n for n in names):
            raise ProjectError(f"--add '{to_label}': the answer '{r['label']}' for {r['image']} holds a "
                               f"label with a space, and '{labels}' separates its labels by spaces: write "
                               "it without the space, or separate the table's labels with ';'")
        label = sep.join(names) if several else r["label"]
        result.new_classes += [n for n in names if n not in known and n not in result.new_classes]
        if listed is not None:  # a row without a label (an unlabeled image of the table): filled in
            listed[label_col] = label
            result.filled += 1
        else:
            where_of[where] = {c: "" for c in header} | {"image": image, label_col: label}
            appended.append(where_of[where])
        result.added += 1
    result.unlabeled = len({w for w in unanswered if not where_of.get(w, {}).get(label_col)}
                           | {w for w, r in where_of.items() if not r.get(label_col)})
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
