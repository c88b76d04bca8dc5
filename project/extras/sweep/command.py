"""``python -m project sweep``: search training settings with Optuna (docs/sweeps.md).

    python -m project sweep --config configs/train.yaml --sweep configs/sweep.yaml \\
        [--n_trials 20] [--timeout S] [--study NAME] [--storage URL|FILE] [--seeds K] [--key=value ...]
    python -m project sweep --report [--study NAME] [--storage URL|FILE]

``--n_trials`` is the number of finished trials the study should hold, not a number to add:
running the same command again after an interruption, or on more workers sharing ``--storage``,
completes the remainder. The extra ``--config`` files and ``--key=value`` overrides are those of
``fit``, applied to every trial under the trial's own parameters. ``--report`` writes the table,
best.yaml and plots of the study as it stands, from any machine that reaches its storage.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

from project.common.argv import leaves
from project.errors import ConfigError, ProjectError
from project.extras.diagnose.tools import split_configs
from project.extras.sweep import results
from project.extras.sweep.space import Param, check_against_config, load_space
from project.extras.sweep.study import (
    SWEEP_ROOT,
    check_same_settings,
    check_storage_folder,
    check_trial_folders,
    load_study,
    open_storage,
    open_study,
    shown,
    storage_url,
)
from project.extras.sweep.trials import TRIAL_ARGS, TrialFailed, TrialRunner, run_study
from project.extras.sweep.workers import claim_lock

DIRECTIONS = {"max": "maximize", "maximize": "maximize", "min": "minimize", "minimize": "minimize"}
LOWER_IS_BETTER = ("loss", "mae", "mse", "error", "ece", "nll")  # a part of the name ends in one


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m project sweep", allow_abbrev=False,
        description="Search training settings with Optuna; each trial is an ordinary fit run. "
                    "Other arguments (--config FILE, --key=value) are fit's, applied to every trial.")
    p.add_argument("--sweep", default="configs/sweep.yaml", help="the search space (YAML)")
    p.add_argument("--n_trials", type=int, default=20,
                   help="finished trials the study should hold (a rerun completes the remainder)")
    p.add_argument("--timeout", type=float, default=None, help="start no new trial after S seconds")
    p.add_argument("--study", default=None, help="study name (default: the sweep file's name)")
    p.add_argument("--storage", default=None,
                   help="where workers share the study: a journal FILE (one machine, several processes) "
                        "or a database URL, e.g. postgresql://user:pw@host/db (several machines); "
                        "default: sqlite:///logs/sweeps/STUDY.db, for one worker")
    p.add_argument("--report", action="store_true",
                   help="run no trial: write the study's table, best.yaml and plots as they stand")
    p.add_argument("--metric", default=None,
                   help="the validation metric to optimise (default: the task's, as the best "
                        "checkpoint's: val/acc; multi-label data: val/map; regression: val/mae)")
    p.add_argument("--direction", default=None, choices=sorted(DIRECTIONS),
                   help="default: the task's for its metric; min for a loss or error (a part of "
                        f"the name ending in {', '.join(LOWER_IS_BETTER)}); else max")
    p.add_argument("--pruner", default="median:3:1",
                   help="median[:STARTUP_TRIALS[:WARMUP_EPOCHS]], halving[:WARMUP_EPOCHS] or none")
    p.add_argument("--seeds", type=int, default=0,
                   help="re-run the best trial's settings with K other seeds: mean and std")
    p.add_argument("--heartbeat", type=int, default=10,
                   help="seconds between a trial's heartbeats; a trial silent for 3 beats is failed")
    p.add_argument("--sampler_seed", type=int, default=None, help="seed of the TPE sampler")
    p.add_argument("--max_failures", type=int, default=3, help="stop after this many failed trials in a row")
    p.add_argument("--show_output", action="store_true",
                   help="print the training output (default: each run folder's train.log)")
    return p


def main(argv: list[str]) -> int:
    a, rest = parser().parse_known_args(argv)
    if a.report:
        return report_only(a.study or Path(a.sweep).stem, a.storage)
    if a.n_trials < 0 or a.seeds < 0 or a.heartbeat < 1:
        raise ConfigError("--n_trials and --seeds must be >= 0 and --heartbeat >= 1")
    space = load_space(a.sweep)
    configs, overrides_ = split_configs(rest)
    base_args = [*configs, *overrides_]
    name = a.study or Path(a.sweep).stem
    folder = SWEEP_ROOT / name
    # before any trial or database: every key and value, and the trial's own arguments
    config = check_against_config(space, base_args, a.sweep, tuple(TRIAL_ARGS))
    task = data_task(config)
    check_task_settings(space, config, task, a.sweep)
    if config.get("model.weights") is None and any(p.key == "model.head_lr_mult" for p in space):
        print(f"Notice: {a.sweep} searches model.head_lr_mult, which changes nothing from random weights "
              "(model.weights: null: every layer is new and learns at model.lr); its column is noise")
    metric, mode = task.monitor, task.mode
    direction = DIRECTIONS[a.direction or (mode if a.metric in (None, metric) else better(a.metric))]
    a.metric = a.metric or metric
    url = storage_url(name, a.storage)
    check_storage_folder(url)
    with claim_lock(url, name):  # workers started at once: one creates the tables and the study
        storage = open_storage(url)
        study = open_study(name, storage, direction, a.pruner, a.sampler_seed)
        check_same_settings(study, json.loads(json.dumps({
            "fit_args": base_args, "config": trained_settings(config),
            "space": [dataclasses.asdict(p) for p in space], "metric": a.metric, "direction": direction},
            default=str)))
        check_trial_folders(study, folder, url)
    runner = TrialRunner(space, base_args, folder, url, a.metric, direction, a.pruner,
                         quiet=not a.show_output)
    print(f"Sweep '{name}': {len(space)} parameter(s), {direction} {a.metric}, {a.n_trials} trials wanted, "
          f"study in {shown(url)}; runs in {folder.resolve()}/", flush=True)
    interrupted = False
    try:
        run_study(study, storage, runner, a.n_trials, a.timeout, a.max_failures, a.heartbeat)
    except KeyboardInterrupt:
        interrupted = True
        print("\nInterrupted: the running trial is marked FAIL; run the same command again to "
              "complete the study.", file=sys.stderr)
    except ProjectError:  # failed trials in a row: the table and best.yaml of those that finished
        report(study, space, base_args, a.metric, folder)
        raise
    best_command = report(study, space, base_args, a.metric, folder)
    if best_command and a.seeds and not interrupted:
        seed_runs(study, space, runner, int(config.get("seed_everything") or 0), a.seeds, a.metric, folder)
    return 130 if interrupted else 0


def report_only(name: str, storage: str | None) -> int:
    """The report of an existing study, with the space and fit arguments it stores."""
    study = load_study(name, storage_url(name, storage))
    settings = study.user_attrs.get("settings")
    if not settings:
        raise ConfigError(f"study '{name}' was not made by `python -m project sweep` (it stores no settings)")
    space = [Param(**{**p, "choices": tuple(p["choices"])}) for p in settings["space"]]
    report(study, space, settings["fit_args"], settings["metric"], SWEEP_ROOT / name)
    return 0


def trained_settings(config) -> dict:
    """Every setting the trials train with, as parsed from the config files and overrides (not
    the files' names: an edited file is another study)."""
    return {k: v for k, v in leaves(config.as_dict()).items() if k != "config" and not k.startswith("__")}


def better(metric: str) -> str:
    """min for a loss or an error (``val/loss``, ``val/per_output/mae/age``), else max."""
    parts = (part.removesuffix("_best") for part in metric.split("/")[1:])
    return "min" if any(part.endswith(LOWER_IS_BETTER) for part in parts) else "max"


def data_task(config):
    """The task class of the config's data, which chooses the metric a sweep follows by default
    (as the best checkpoint does: val/acc; multi-label data: val/map; numbers: the lowest val/mae)."""
    from project import tasks

    task, labels = config.get("data.task") or "auto", config.get("data.labels")
    if labels:
        from project.data.tables import read_table

        task = read_table(labels, config.get("data.data_dir"), task=task).task or task
    return tasks.task_class(None if task == "auto" else task)


def default_objective(config) -> tuple[str, str]:
    """(metric, max or min) a sweep of the config's data follows by default."""
    task = data_task(config)
    return task.monitor, task.mode


def check_task_settings(space: list[Param], config, task, where: str) -> None:
    """Each end of the space's model settings against what the data's task accepts (a regression
    refuses label smoothing): one line now, not one failed trial after another."""
    model = config.get("model").as_dict()
    checker = task.__new__(task)  # Task.check reads the settings given, not the task's state
    try:
        checker.check(model)
    except ConfigError as err:
        raise ConfigError(f"the training config does not suit this data: {err}") from None
    for param in space:
        key = param.key.removeprefix("model.")
        for value in param.samples() if param.key.startswith("model.") else []:
            try:
                checker.check({**model, key: value})
            except ConfigError as err:
                raise ConfigError(f"{where}: '{param.key}': {value!r} is not for this data: {err}") from None


def report(study, space: list[Param], base_args: list[str], metric: str, folder: Path) -> str | None:
    """Table, CSV, best.yaml and plots; the best trial's fit command (None without one)."""
    rows = results.trial_rows(study, space)
    print("\n" + results.format_table(rows, metric))
    results.write_csv(rows, folder / "trials.csv")
    states = [r["state"] for r in rows]
    print(f"\n{len(rows)} trials: {states.count('COMPLETE')} complete, {states.count('PRUNED')} pruned, "
          f"{states.count('FAIL')} failed. Table: {folder / 'trials.csv'}")
    for note in results.save_plots(study, folder):
        print(f"  ({note})")
    made = [name for name in ("history.png", "importance.png", "curves.png") if (folder / name).is_file()]
    print(f"Plots: {folder}/{', '.join(made) or '(none yet)'}. "
          f"TensorBoard HPARAMS: tensorboard --logdir {folder}")
    if results.best_trial(study) is None:
        print("No trial has finished yet, so there is no best configuration.")
        return None
    best = study.best_trial
    command = results.write_best(study, space, base_args, metric, folder / "best.yaml")
    run = best.user_attrs.get("run_dir", "no run folder")
    print(f"\nBest: trial {best.number}, {metric}={best.value:.4f} ({run})")
    print(f"Its settings: {folder / 'best.yaml'}. Train with them:\n  {command}")
    return command


def seed_runs(study, space: list[Param], runner: TrialRunner, base_seed: int, k: int, metric: str,
              folder: Path) -> dict[int, float]:
    """Re-run the best trial's settings with seeds base+1..base+k (not the trial's own seed),
    each an ordinary run in ``<trial>_seedS/``; a finished one is reused on a rerun."""
    best = study.best_trial
    values = results.best_values(best, space)
    scores: dict[int, float] = {}
    for seed in range(base_seed + 1, base_seed + 1 + k):
        run = f"trial_{best.number:03d}_seed{seed}"
        done = folder / run / "sweep_result.json"
        if done.is_file():
            scores[seed] = json.loads(done.read_text(encoding="utf-8"))["value"]
            continue
        print(f"seed {seed}: re-running trial {best.number}'s settings in {folder / run}", flush=True)
        try:
            scores[seed] = runner.run(runner.fit_args(values, run, seed=seed), run)["value"]
        except TrialFailed as err:
            print(f"  -> FAILED: {err}", flush=True)
    if scores:
        rows = [{"seed": s, "value": v, "run_dir": str(folder / f"trial_{best.number:03d}_seed{s}")}
                for s, v in scores.items()]
        results.write_csv(rows, folder / "seeds.csv")
        print(f"\nTrial {best.number} ({metric}={best.value:.4f} with seed {base_seed}); "
              + results.seed_summary(scores, metric) + f". Table: {folder / 'seeds.csv'}")
    return scores
