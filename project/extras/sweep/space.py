"""The search space: a small YAML file of training-config keys and how to sample each.

    model.lr: {log_uniform: [1.0e-4, 1.0e-1]}
    model.head_lr_mult: {choice: [1.0, 10.0]}
    model.scheduler.init_args.warmup_epochs: {int: [0, 3]}
    data.augmentation.color_jitter: {uniform: [0.0, 0.4], step: 0.1}
    data.augmentation.crop_scale: {choice: [[0.6, 1.0], [0.35, 1.0]]}

Keys are the dotted names of ``fit``'s settings (``fit --config configs/train.yaml --print_config``
lists them); every key is checked against the real config parser before any trial runs, so a
typo fails at once.
"""

from __future__ import annotations

import difflib
import json
import math
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from project.errors import ConfigError

KINDS = ("log_uniform", "uniform", "int", "log_int", "choice")
EXAMPLE = "e.g. 'model.lr: {log_uniform: [1.0e-4, 1.0e-1]}' or 'model.backbone: {choice: [resnet18]}'"
_SCALARS = (str, int, float, bool, type(None))


@dataclass(frozen=True)
class Param:
    """One searched setting. ``choices`` of lists (e.g. crop scales) are stored in Optuna as
    JSON strings, since its categorical values must be scalars."""

    key: str
    kind: str
    low: float | int | None = None
    high: float | int | None = None
    step: float | int | None = None
    choices: tuple = ()

    @property
    def encoded(self) -> bool:
        return any(not isinstance(c, _SCALARS) for c in self.choices)

    def suggest(self, trial) -> Any:
        """Sample this setting for an Optuna trial (the value the training run gets)."""
        if self.kind == "choice":
            if self.encoded:
                return json.loads(trial.suggest_categorical(self.key, [json.dumps(c) for c in self.choices]))
            return trial.suggest_categorical(self.key, list(self.choices))
        if self.kind in ("int", "log_int"):
            return trial.suggest_int(self.key, int(self.low), int(self.high), step=int(self.step or 1),
                                     log=self.kind == "log_int")
        return trial.suggest_float(self.key, float(self.low), float(self.high), step=self.step,
                                   log=self.kind == "log_uniform")

    def decode(self, stored: Any) -> Any:
        """The training value of a parameter as Optuna stored it."""
        return json.loads(stored) if self.kind == "choice" and self.encoded else stored

    def samples(self) -> list[Any]:
        """The values to check against the config parser: both ends, or every choice."""
        return list(self.choices) if self.kind == "choice" else [self.low, self.high]


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def parse_param(key: str, spec: Any, where: str) -> Param:
    """One entry of the space file, checked; the error names the file, the key and the fix."""
    if not isinstance(spec, dict) or len(set(spec) & set(KINDS)) != 1 or set(spec) - {*KINDS, "step"}:
        raise ConfigError(f"{where}: '{key}' needs exactly one of {', '.join(KINDS)} (plus an "
                          f"optional step), got {spec!r}; {EXAMPLE}")
    kind = next(k for k in KINDS if k in spec)
    value, step = spec[kind], spec.get("step")
    if kind == "choice":
        if not isinstance(value, list) or not value:
            raise ConfigError(f"{where}: '{key}': choice needs a non-empty list, got {value!r}")
        if step is not None:
            raise ConfigError(f"{where}: '{key}': step does not apply to choice")
        return Param(key, kind, choices=tuple(value))
    if not (isinstance(value, list) and len(value) == 2 and all(map(_number, value))
            and value[0] < value[1]):
        raise ConfigError(f"{where}: '{key}': {kind} needs [low, high] with low < high, got {value!r}")
    if kind.startswith("log") and value[0] <= 0:
        raise ConfigError(f"{where}: '{key}': {kind} needs low > 0 (a logarithmic range), got {value!r}; "
                          "use uniform or int for ranges that start at 0")
    if kind in ("int", "log_int") and not all(float(v).is_integer() for v in value):
        raise ConfigError(f"{where}: '{key}': int needs whole numbers, got {value!r}; use uniform for floats")
    if step is not None and (not _number(step) or step <= 0 or kind.startswith("log")):
        raise ConfigError(f"{where}: '{key}': step must be a positive number and cannot be combined "
                          f"with a logarithmic range, got {step!r}")
    return Param(key, kind, value[0], value[1], step)


def load_space(path: str | Path) -> list[Param]:
    """Read and check the space file."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"sweep file '{path}' does not exist: pass --sweep with a YAML file of "
                          "config keys to search, e.g. --sweep configs/sweep.yaml")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: not valid YAML: {err}") from err
    if not isinstance(data, dict) or not data:
        raise ConfigError(f"{path}: expected a mapping of config keys to distributions; {EXAMPLE}")
    return [parse_param(str(key), spec, str(path)) for key, spec in data.items()]


def cli_value(value: Any) -> str:
    """A value as the training command line takes it (``--key=VALUE``)."""
    if isinstance(value, bool) or value is None or isinstance(value, list | tuple | dict):
        return json.dumps(value)
    return repr(value) if isinstance(value, float) else str(value)


def overrides(values: dict[str, Any]) -> list[str]:
    return [f"--{key}={cli_value(value)}" for key, value in values.items()]


def nested(values: dict[str, Any]) -> dict:
    """``{"model.lr": 0.1}`` -> ``{"model": {"lr": 0.1}}``: a config overlay for ``--config``."""
    out: dict = {}
    for key, value in values.items():
        node = out
        *parents, leaf = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = list(value) if isinstance(value, tuple) else value
    return out


def check_against_config(space: list[Param], base_args: list[str], where: str,
                         trial_args: tuple[str, ...] = ()):
    """Parse the training config once with every key and sample value of the space, the way
    ``fit`` will, so an unknown key or a value of the wrong type fails before any trial.
    ``trial_args``: what the sweep adds to every trial (its run folder), checked too.
    Returns the parsed base config."""
    from jsonargparse import ArgumentError

    from project.cli import ProjectCLI

    class _ParseOnly(ProjectCLI):
        def parse_arguments(self, parser, args) -> None:
            parser.exit_on_error = False  # raise instead of printing usage and exiting
            super().parse_arguments(parser, args)

        def before_instantiate_classes(self) -> None:
            pass

        def instantiate_classes(self) -> None:
            pass

    try:
        with warnings.catch_warnings():  # about passing args from Python: that is the intent here
            warnings.simplefilter("ignore")
            cli = _ParseOnly(args=base_args, run=False)
    except ArgumentError as err:
        raise ConfigError(f"the training arguments do not parse: {_first_line(err)}") from err
    try:
        cli.parser.parse_args([*base_args, *trial_args])
    except ArgumentError as err:
        raise ConfigError(f"the trial command does not parse: {_first_line(err)}") from err
    known = list(cli.config.keys())
    for param in space:
        if param.key not in cli.config:
            close = difflib.get_close_matches(param.key, known, n=3, cutoff=0.6)
            hint = f" (did you mean {', '.join(close)}?)" if close else ""
            raise ConfigError(f"{where}: unknown config key '{param.key}'{hint}: the training config "
                              "has no such setting; list them with python -m project fit "
                              "--config configs/train.yaml --print_config")
        for value in param.samples():
            try:
                cli.parser.parse_args([*base_args, *overrides({param.key: value})])
            except ArgumentError as err:
                raise ConfigError(f"{where}: '{param.key}': the value {value!r} is not valid for this "
                                  f"setting: {_first_line(err)}") from err
    return cli.config


def _first_line(err: Exception) -> str:
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    return " ".join(lines[:2])
