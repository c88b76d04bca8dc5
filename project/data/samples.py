"""Samples and splits, below both the folders' reader and the splitter."""

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Sample:
    path: str
    label: object  # a class index for folders; a table's: as its task encodes it (project/tasks/)


@dataclass
class FolderSplits:
    classes: list[str]
    train: list[Sample]
    val: list[Sample]
    test: list[Sample]
    task: str | None = None  # the task the labels describe (project/tasks/); None: class folders' default
    left_out: dict[str, int] = field(default_factory=dict)  # class folders' non-image files: {ext: count}
    drawn: dict = field(default_factory=dict)  # the settings a drawn split came from ({}: the data's own)
