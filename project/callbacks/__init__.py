"""Callbacks that every run gets (the configurable ones are listed in configs/train.yaml)."""

from __future__ import annotations

from lightning.pytorch.callbacks import Callback

from project.callbacks.badimages import BadImageReport
from project.callbacks.guards import InputCheck, NonFiniteGuard, ParameterCheck
from project.callbacks.report import TestReport
from project.callbacks.resilience import InterruptCheckpoint, RngState
from project.callbacks.summary import RunSummary


def guard_callbacks() -> list[Callback]:
    """Checks that stop a broken run early with a diagnosis; on in every run and tool."""
    return [ParameterCheck(), InputCheck(), NonFiniteGuard()]


def default_callbacks() -> list[Callback]:
    """Always on in training: they guard correctness rather than tune a run."""
    return [*guard_callbacks(), RngState(), InterruptCheckpoint(), BadImageReport(), RunSummary(),
            TestReport()]
