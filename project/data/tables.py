"""Labels from a table beside the images (``data.labels``): an ``image`` column of paths relative
to ``data.data_dir``, an optional ``split`` column (train/val/test), and label columns that one
task claims (``project/tasks/*/labels.py``: ``image,label``, ``image,labels``, numbers, several
word columns, ...). This module reads the file, the paths and the splits; the claiming task reads
its columns. Imported only when ``data.labels`` is set; every problem names the table's line.
"""

from __future__ import annotations

import csv
import logging
import os
import unicodedata
from dataclasses import dataclass, field
from pathlib import Path

from project import tasks
from project.data.folders import DataFolderError, FolderSplits, Sample, check_fractions, split_of
from project.data.splits import drawn_with
from project.tasks.labels import Labels, Row

log = logging.getLogger(__name__)

SPLITS = ("train", "val", "test")
OWN_COLUMNS = ("image", "split")
OTHER_SEPARATORS = {";": "semicolon", "\t": "tab"}  # a spreadsheet's other exports: named, not guessed


@dataclass
class Table:
    """A labels table as read: its rows, the task that reads them, and its problems."""

    path: Path
    rows: list[Row] = field(default_factory=list)
    task: str | None = None  # the registered name (or package.module:Class) of the claiming task
    labels: Labels | None = None
    unlabeled: list[str] = field(default_factory=list)  # images of empty-label rows, when allowed
    problems: list[str] = field(default_factory=list)

    @property
    def classes(self) -> list[str]:
        """The model's outputs, in order (the claiming task names them)."""
        return self.labels.names(self.rows) if self.labels is not None else []


def registered_tasks() -> list:
    """Every registered task class, in ``tasks.TASKS``' order: each is asked whether it reads a table."""
    return [tasks.task_class(name) for name in tasks.TASKS]


def labels_of(cls) -> type[Labels]:
    """A task's reader of tables (``Task.labels``: package.module:Class)."""
    return tasks.load(cls.labels, f"{cls.__name__}.labels") if cls.labels else Labels


def wrong_columns(path: Path, columns: list[str]) -> str:
    """What a table whose columns no task reads is, and what the tasks read."""
    formats = "; or ".join(labels_of(cls).format for cls in registered_tasks() if labels_of(cls).format)
    other = [name for sep, name in OTHER_SEPARATORS.items() if len(columns) == 1 and sep in columns[0]]
    hint = f" (one column: the table is {other[0]}-separated; save it comma-separated)" if other else ""
    return (f"{path} line 1: columns {', '.join(columns) or 'none'}{hint}; expected columns image and "
            f"{formats}; and optionally split (train, val or test)")


def choose_task(path: Path, columns: list[str], cells: dict[str, list[str]], task: str) -> tuple[str, Labels]:
    """The task that reads the table (``task``: data.task, auto or one of them) and its reader."""
    if task != "auto":
        reader = labels_of(tasks.task_class(task))
        found = reader.accept(columns, cells)
        if found is None:
            if task in tasks.TASKS:
                fix = f"{reader.format or 'not a table this task reads'}; set data.task=auto"
            else:  # an own task: data.task=auto would drop it; the table is what to change
                wants = reader.format or f"the columns {reader.__name__}.accept takes"
                fix = f"the task reads image and {wants}; rename the table's column to the one it reads"
            raise DataFolderError(f"data.task={task}, but {path} has columns {', '.join(columns)}: {fix}")
        return task, looked(reader(found, path), cells)
    claims = [(name, reader, reader.claim(columns, cells)) for name, reader in zip(
        tasks.TASKS, map(labels_of, registered_tasks()), strict=True)]
    claims = [c for c in claims if c[2] is not None]
    if not claims:
        raise DataFolderError(wrong_columns(path, columns))
    if len(claims) > 1:
        raise DataFolderError(f"{path}: tasks {', '.join(c[0] for c in claims)} each read its columns; "
                              "choose with data.task")
    name, reader, found = claims[0]
    return name, looked(reader(found, path), cells)


def looked(labels: Labels, cells: dict[str, list[str]]) -> Labels:
    """The reader once it has seen the whole columns (``Labels.look``: a column's separator)."""
    labels.look(cells)
    return labels


_NOTICED: set[tuple[str, tuple[str, ...]]] = set()  # once per table (init reads it twice)


def notice_unread(table: Table, unread: list[str]) -> None:
    """A notice naming the columns the claiming task leaves unread (``image,label,color``: the
    ``label`` column claims a single-label run), never dropped without a word."""
    key = (os.path.abspath(table.path), tuple(unread))
    if not unread or key in _NOTICED:
        return
    _NOTICED.add(key)
    read = table.labels.columns
    fix = (f"rename '{read[0]}' (e.g. to class) to train on every word column (multi-output), or drop "
           "them" if read == ["label"] else "drop them from the table")
    names = ", ".join(unread[:5]) + (f" and {len(unread) - 5} more" if len(unread) > 5 else "")
    log.warning("Notice: %s: column%s %s not trained on (the %s run reads %s); %s", table.path,
                "s" if len(unread) > 1 else "", names, table.task, ", ".join(read), fix)


def not_found_fix(image: str, table_dir: Path) -> str:
    """The likely fix for an image path that data.data_dir does not hold."""
    if "\\" in image:
        return "; write paths with / (a Windows \\ is part of a name here)"
    if (table_dir / image).is_file():
        return f"; the paths are relative to the table's folder: set data.data_dir={table_dir}"
    return ""


def empty_row(row: dict) -> bool:
    """A row of empty cells (``,,,``: a spreadsheet's trailing rows), skipped as a blank line is."""
    cells = [v for k, v in row.items() if k is not None] + list(row.get(None) or [])
    return not any((v or "").strip() for v in cells)


def unicode_twin(root: Path, image: str) -> str:
    """``image`` as the disk spells it where the two differ in Unicode form alone (a table written on
    macOS names ``café.jpg`` in NFD, most disks hold it in NFC)."""
    for form in ("NFC", "NFD"):
        other = unicodedata.normalize(form, image)
        if other != image and (root / other).is_file():
            return other
    return image


def read_table(path: str | Path, data_dir: str | Path, unlabeled_ok: bool = False,
               task: str = "auto") -> Table:
    """Every row of the table with its problems (a missing image, a repeated image, an unknown
    split, and the task's own: an empty or unreadable label, ...). ``unlabeled_ok``: rows with an
    empty label are unlabeled images (``data.unlabeled.images`` names the table)."""
    table = Table(Path(path))
    if not table.path.is_file():
        table.problems.append(f"data.labels '{path}' does not exist")
        return table
    root = Path(data_dir)
    try:
        with open(table.path, newline="", encoding="utf-8-sig") as f:
            reader = csv.DictReader(f)
            columns = [c.strip() for c in reader.fieldnames or []]
            columns = [c.lower() if c.lower() in OWN_COLUMNS else c for c in columns]  # Image, SPLIT
            reader.fieldnames = columns
            raw = [(line, row) for line, row in enumerate(reader, start=2) if not empty_row(row)]
    except UnicodeDecodeError as err:  # a binary file, or another encoding
        table.problems.append(f"{path} is not a text table in UTF-8 ({err.reason} at byte {err.start}); "
                              "save it as CSV in UTF-8")
        return table
    if "image" not in columns:
        table.problems.append(wrong_columns(path, columns))
        return table
    repeated = sorted({c for c in columns if c and columns.count(c) > 1})
    if repeated:  # csv keeps the last of them alone
        table.problems.append(f"{path} line 1: column {', '.join(repeated)} appears more than once; "
                              "give each column its own name")
        return table
    cells = {c: [(r.get(c) or "") for _, r in raw] for c in columns if c not in OWN_COLUMNS and c}
    try:
        table.task, table.labels = choose_task(table.path, columns, cells, task)
    except DataFolderError as err:
        table.problems.append(str(err))
        return table
    notice_unread(table, [c for c in cells if c not in table.labels.columns])
    first_line: dict[str, int] = {}
    for line, row in raw:
        image, given_split = (row.get("image") or "").strip(), (row.get("split") or "").strip()
        split = split_of(given_split) if given_split else None  # Train, valid, validation, ...

        def problem(text: str, line=line) -> None:
            table.problems.append(f"{path} line {line}: {text}")

        if any((v or "").strip() for v in row.get(None, ())):  # fields past the header's: never dropped
            problem(f"{len(columns) + len(row[None])} fields for the {len(columns)} columns of line 1; "
                    'quote a value that holds a comma ("a, b")')
            continue
        label, bad = table.labels.read(row)
        if bad:
            problem(bad)
            continue
        if not image:
            problem("no image path")
            continue
        if not (root / image).is_file():
            image = unicode_twin(root, image)
        same = os.path.abspath(root / image)  # ./a.jpg and a.jpg: one image, in one split
        if same in first_line:
            problem(f"'{image}' is listed again (first on line {first_line[same]}); one row per image")
            continue
        first_line[same] = line
        if not (root / image).is_file():
            problem(f"'{image}' not found in data.data_dir '{root}'{not_found_fix(image, table.path.parent)}")
        if label is None and unlabeled_ok and split in (None, "train"):
            table.unlabeled.append(image)
            continue
        if label is None:
            problem(f"empty label for '{image}' (a blank or NaN cell; data.unlabeled.images={path} "
                    "makes such rows unlabeled images)")
        if given_split and split is None:
            problem(f"split '{given_split}' must be train, val or test")
        table.rows.append(Row(line, image, label, split))
    if not table.problems:
        table.problems += table.labels.check(table.rows)
    if not table.rows and not table.problems:
        table.problems.append(f"{path} has no rows; {wrong_columns(path, []).split('; ', 1)[1]}")
    return table


def unlisted_images(table: Table, data_dir: str | Path) -> list[str]:
    """Images below ``data_dir`` that no row names (check-data's warning: they are not trained on)."""
    from project.common.files import list_images

    root = Path(data_dir)
    listed = {str((root / r.image).resolve()) for r in table.rows}
    return [p for p in list_images(root) if str(Path(p).resolve()) not in listed]


def discover_table(labels: str | Path, data_dir: str | Path, task: str = "auto",
                   val_fraction: float = 0.15, test_fraction: float = 0.15, seed: int = 0,
                   unlabeled_ok: bool = False) -> FolderSplits:
    """The splits of a labels table: its ``split`` column, else the task's seeded stratified split."""
    check_fractions(val_fraction, test_fraction)
    if not Path(data_dir).is_dir():
        raise DataFolderError(f"data.data_dir '{data_dir}' is not a folder (the images of data.labels "
                              "are found relative to it)")
    table = read_table(labels, data_dir, unlabeled_ok, task)
    if table.problems:
        more = len(table.problems) - 1
        tail = (f" (and {more} more: python -m project check-data {data_dir} --labels {labels} lists "
                "them)" if more else "")
        raise DataFolderError(table.problems[0] + tail)
    names, reader = table.classes, table.labels
    by_split: dict[str | None, list[Sample]] = {s: [] for s in (None, *SPLITS)}
    for r in table.rows:
        by_split[r.split].append(Sample(str(Path(data_dir) / r.image), reader.encode(r.label, names)))
    for samples in by_split.values():  # the folders' order (path): the same split from the same files
        samples.sort(key=lambda s: s.path)
    if by_split[None] and len(by_split[None]) < len(table.rows):  # a split column, blank in places
        first = min(r.line for r in table.rows if r.split is None)
        log.warning("Notice: %d rows of '%s' have no split (the first on line %d): they are trained on; "
                    "write train, val or test in each", len(by_split[None]), labels, first)
    train = by_split["train"] + by_split[None]
    if by_split["val"]:
        return FolderSplits(names, train, by_split["val"], by_split["test"], table.task)
    test = by_split["test"] if by_split["test"] or by_split["train"] else None
    split = reader.split(train, test, val_fraction, test_fraction, seed, Path(data_dir))
    return FolderSplits(names, *split, table.task, drawn=drawn_with(val_fraction, test_fraction, seed,
                                                                   test is not None))
