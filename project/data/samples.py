"""What a data set is made of: samples (a file and its label) and the splits of a data set.
Below both the folders' reader and the splitter, so neither imports the other for them."""

from dataclasses import dataclass


@dataclass(frozen=True)
class Sample:
    path: str
    # a class index; multi-label: 0/1 per class; regression: the numbers (``data/tables.py``)
    label: object  # a class index for folders; a table's: as its task encodes it (project/tasks/)


@dataclass
class FolderSplits:
    classes: list[str]
    train: list[Sample]
    val: list[Sample]
    test: list[Sample]
    task: str | None = None  # the task the labels describe (project/tasks/); None: class folders' default
