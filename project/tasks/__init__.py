"""What a run learns: one folder a task, named once in ``TASKS``; ``data.task`` is ``auto``, a name
there, or ``package.module:Class`` (docs/your-own-task.md). Torch-free: ``infer.py`` reads it."""

from __future__ import annotations

from importlib import import_module

from project.errors import ConfigError

# name -> its Task class; the first is the default (what class folders hold)
TASKS = {
    "multiclass": "project.tasks.single.task:SingleLabel",
    "multilabel": "project.tasks.multilabel.task:MultiLabel",
    "regression": "project.tasks.regression.task:Regression",
    "multioutput": "project.tasks.multioutput.task:MultiOutput",
}
DEFAULT = next(iter(TASKS))


def load(spec: str, key: str) -> object:
    """The object at ``package.module:Name``; a one-line error naming ``key`` when it is not there."""
    module, _, attr = spec.partition(":")
    try:
        return getattr(import_module(module), attr)
    except (ImportError, AttributeError, ValueError) as err:
        raise ConfigError(f"{key} '{spec}': cannot import it ({type(err).__name__}: {err}); expected "
                          "package.module:Name, importable from here") from None


def check_name(name: str | None, key: str = "data.task") -> str:
    """``name`` (None: the default) if it is a registered task or ``package.module:Class``."""
    name = DEFAULT if name is None else name
    if name not in TASKS and ":" not in name:
        raise ConfigError(f"{key} '{name}' is unknown; choose from auto, {', '.join(TASKS)}, or "
                          "package.module:Class for your own")
    return name


def task_class(name: str | None = None):
    """The :class:`~project.tasks.base.Task` subclass of ``name`` (None: the default)."""
    name = check_name(name)
    return load(TASKS.get(name, name), "data.task")
