"""What a data set is made of: samples (a file and its label) and the splits of a data set.
Below both the folders' reader and the splitter, so neither imports the other for them."""

from dataclasses import dataclass

from project import tasks


@dataclass(frozen=True)
class Sample:
    path: str
    # a class index; multi-label: 0/1 per class; regression: the numbers (``data/tables.py``)
    label: int | tuple[int, ...] | tuple[float, ...]


@dataclass
class FolderSplits:
    classes: list[str]
    train: list[Sample]
    val: list[Sample]
    test: list[Sample]
    task: str = tasks.DEFAULT  # what the labels describe (project/tasks/): folders hold one class each
