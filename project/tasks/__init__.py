"""What a run learns: one module a task behind :class:`project.tasks.base.Task`, and this
registry, the one place that names them. The data decides the task (``data.task: auto``); every
command asks the task (its loss, metrics, monitored metric, outputs, reports), never its name.

Torch-free, like :mod:`project.tasks.answers`: ``infer.py`` reads both without torch.
"""

from __future__ import annotations

from importlib import import_module

from project.errors import ConfigError

# name -> "module:class"; a task's module is imported only when a run of that task needs it
TASKS = {
    "multiclass": "project.tasks.single:SingleLabel",  # one class per image (the default)
    "multilabel": "project.tasks.multilabel:MultiLabel",  # any number of labels per image
    "regression": "project.tasks.regression:Regression",  # one or more numbers per image
}
SINGLE_LABEL, MULTI_LABEL, REGRESSION = TASKS  # what the data can say it holds
DEFAULT = SINGLE_LABEL


def check_name(name: str, key: str = "data.task") -> str:
    if name not in TASKS:
        raise ConfigError(f"{key} '{name}' is unknown; choose from auto, {', '.join(TASKS)}")
    return name


def task_class(name: str):
    """The :class:`~project.tasks.base.Task` subclass registered as ``name``."""
    module, cls = TASKS[check_name(name)].split(":")
    return getattr(import_module(module), cls)
