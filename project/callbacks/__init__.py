"""Callbacks of a training run; each one is listed in configs/train.yaml.

``REQUIRED_CALLBACKS`` are added (with a notice) when a config leaves them out, because a run
without them can silently go wrong or lose work. The diagnosis tools use ``guard_callbacks``.
"""

from __future__ import annotations

from lightning.pytorch.callbacks import Callback

from project.callbacks.guards import InputCheck, NonFiniteGuard, ParameterCheck

REQUIRED_CALLBACKS = (
    "project.callbacks.guards.ParameterCheck",
    "project.callbacks.guards.InputCheck",
    "project.callbacks.guards.NonFiniteGuard",
    "project.callbacks.resilience.RngState",
    "project.callbacks.resilience.InterruptCheckpoint",
)


def guard_callbacks() -> list[Callback]:
    """Checks that stop a broken run early with a diagnosis: for the diagnosis tools."""
    return [ParameterCheck(), InputCheck(), NonFiniteGuard()]


def default_callbacks() -> list[Callback]:
    """The required callbacks plus reports, for a ``Trainer`` built in Python (notebooks,
    benchmarks, tests); the CLI takes its list from configs/train.yaml instead."""
    from project.callbacks.badimages import BadImageReport
    from project.callbacks.report import TestReport
    from project.callbacks.resilience import InterruptCheckpoint, RngState
    from project.callbacks.summary import RunSummary

    return [*guard_callbacks(), RngState(), InterruptCheckpoint(), BadImageReport(), RunSummary(),
            TestReport()]
