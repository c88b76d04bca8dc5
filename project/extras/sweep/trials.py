"""One trial = one ordinary ``python -m project fit`` run in a child process, and the loop
that runs trials until the study holds the number asked for.

A child process keeps a crash, a CUDA error or a memory leak inside its trial, and lets DDP
presets work unchanged (the child launches its own ranks).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import optuna
from optuna.storages import BaseStorage
from optuna.trial import TrialState

from project.errors import ProjectError
from project.extras.sweep import pruning, workers
from project.extras.sweep.space import Param, overrides

DONE = (TrialState.COMPLETE, TrialState.PRUNED)


class TrialFailed(Exception):
    """The trial's training run failed; the study records FAIL and the sweep goes on."""


TRIAL_ARGS = [f"--trainer.callbacks+={pruning.CALLBACK}"]  # a trial reports to the sweep


@dataclass
class TrialRunner:
    """Builds and runs a trial's ``fit`` command; the objective Optuna calls."""

    space: list[Param]
    base_args: list[str]              # the stacked --config files and --key=value overrides
    study_dir: Path                   # logs/sweeps/<study>/: trial_NNN/ run folders go here
    storage_url: str
    metric: str
    direction: str
    pruner: str
    quiet: bool = True                # the child's output goes to its run folder's train.log
    env: dict = field(default_factory=dict)

    def fit_args(self, values: dict, folder: str, seed: int | None = None) -> list[str]:
        """The command line of a run with these parameter values, in ``study_dir/folder``."""
        return [*self.base_args, *overrides(values),
                *([f"--seed_everything={seed}"] if seed is not None else []),
                *TRIAL_ARGS, "--run_dir", str(self.study_dir / folder)]

    def __call__(self, trial: optuna.Trial) -> float:
        values = {p.key: p.suggest(trial) for p in self.space}
        folder = f"trial_{trial.number:03d}"
        trial.set_user_attr("run_dir", str((self.study_dir / folder).resolve()))
        trial.set_user_attr("worker", f"{socket.gethostname()}:{os.getpid()}")
        print(f"trial {trial.number}: {_describe(values)}", flush=True)
        try:
            result = self.run(self.fit_args(values, folder), folder, {
                pruning.ENV_STORAGE: self.storage_url, pruning.ENV_STUDY: trial.study.study_name,
                pruning.ENV_TRIAL: str(trial.number), pruning.ENV_PRUNER: self.pruner})
        except TrialFailed as err:
            trial.set_user_attr("error", str(err)[-3000:])
            raise
        trial.set_user_attr("epochs", result["epochs"])
        if result["pruned_epoch"] is not None:
            raise optuna.TrialPruned(f"pruned after epoch {result['pruned_epoch']}")
        return result["value"]

    def run(self, args: list[str], folder: str, extra_env: dict | None = None) -> dict:
        """Train in a child process; its ``sweep_result.json``, or TrialFailed with the log's tail."""
        run_dir = self.study_dir / folder
        run_dir.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, **self.env, **(extra_env or {}), "PYTHONUNBUFFERED": "1",
               pruning.ENV_METRIC: self.metric, pruning.ENV_DIRECTION: self.direction}
        log_path = run_dir / "train.log"
        with open(log_path, "w", encoding="utf-8") as out:
            proc = subprocess.Popen([sys.executable, "-m", "project", "fit", *args], env=env,
                                    stdout=out if self.quiet else None, stderr=subprocess.STDOUT,
                                    preexec_fn=_die_with_parent)
            try:
                code = proc.wait()
            finally:  # Ctrl+C (the child got it too) or a kill: let it save and stop
                _stop(proc)
        result_file = run_dir / pruning.RESULT_FILE
        if code != 0 or not result_file.is_file():
            raise TrialFailed(f"the training run exited with code {code}; see {log_path}:\n"
                              + _tail(log_path))
        result = json.loads(result_file.read_text(encoding="utf-8"))
        if result["value"] is None and result["pruned_epoch"] is None:
            raise TrialFailed(f"the run logged no finite {self.metric}; see {log_path}")
        return result


def run_study(study: optuna.Study, storage: BaseStorage, objective: TrialRunner, n_trials: int,
              timeout: float | None, max_failures: int = 3, heartbeat: float = 10.0,
              poll: float = 2.0) -> None:
    """Run trials until the study holds ``n_trials`` finished ones (COMPLETE or PRUNED; FAIL
    does not count), as other workers may be doing at the same time. A trial is claimed only
    while finished plus running trials are short of the total, so workers never overshoot it;
    a worker that finds them all claimed waits, failing (and queueing again) a trial whose
    worker stopped beating, so a dead worker's trial is re-run by a live one."""
    start, failures, waiting = time.monotonic(), 0, False
    watch = workers.StaleWatch(grace=3 * heartbeat)
    while True:
        with workers.claim_lock(objective.storage_url, study.study_name):
            for number in workers.fail_stale(study, storage, watch):
                print(f"trial {number}: its worker stopped beating; marked FAIL and queued again",
                      flush=True)
            trials = study.get_trials(deepcopy=False)
            done = sum(t.state in DONE for t in trials)
            running = sum(t.state == TrialState.RUNNING for t in trials)
            if done >= n_trials:
                return
            if timeout is not None and time.monotonic() - start > timeout:
                print(f"--timeout {timeout:g} s reached: no new trial started ({done} of {n_trials} done)")
                return
            trial = study.ask() if done + running < n_trials else None  # a queued retry first
        if trial is None:
            if not waiting:
                print(f"waiting for {running} running trial(s) of other workers (a dead worker's trial "
                      "is failed and queued again when its heartbeat stops)", flush=True)
                waiting = True
            time.sleep(poll)
            continue
        waiting = False
        finished = run_trial(study, storage, trial, objective, heartbeat)
        _print_outcome(finished, objective.metric)
        failures = failures + 1 if finished.state == TrialState.FAIL else 0
        if "is not logged by this run" in finished.user_attrs.get("error", ""):
            raise ProjectError(f"--metric {objective.metric} is not logged by the training run; "
                               f"see {finished.user_attrs.get('run_dir')}/train.log for the metrics it logs")
        if failures >= max_failures:
            raise ProjectError(f"{failures} trials in a row failed; the last one's log says why: "
                               f"{finished.user_attrs.get('run_dir')}/train.log")


def run_trial(study: optuna.Study, storage: BaseStorage, trial: optuna.Trial, objective: TrialRunner,
              heartbeat: float) -> optuna.trial.FrozenTrial:
    """Run one claimed trial with its heartbeat and record how it ended (on Ctrl+C: FAIL)."""
    trial_id = storage.get_trial_id_from_study_id_trial_number(
        storage.get_study_id_from_name(study.study_name), trial.number)
    state, value = TrialState.FAIL, None
    with workers.Heartbeat(storage, trial_id, heartbeat):
        try:
            value, state = objective(trial), TrialState.COMPLETE
        except optuna.TrialPruned:
            state = TrialState.PRUNED
        except TrialFailed:
            pass  # the objective recorded why
        finally:
            study.tell(trial, value, state=state, skip_if_finished=True)
    finished = storage.get_trial(trial_id)
    if finished.state != state:
        print(f"  (trial {trial.number} was failed by another worker while it ran, its heartbeat "
              "unseen: this result is not in the study; its run folder keeps it)", flush=True)
    return finished


def _print_outcome(trial: optuna.trial.FrozenTrial, metric: str) -> None:
    seconds = trial.duration.total_seconds() if trial.duration else 0.0
    if trial.state == TrialState.COMPLETE:
        print(f"  -> {metric}={trial.value:.4f} in {seconds:.0f} s", flush=True)
    elif trial.state == TrialState.PRUNED:
        print(f"  -> pruned after {len(trial.intermediate_values)} epoch(s) ({seconds:.0f} s)", flush=True)
    else:
        print(f"  -> FAILED: {trial.user_attrs.get('error', 'no reason recorded')}", flush=True)


def _describe(values: dict) -> str:
    return " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in values.items())


def _tail(path: Path, lines: int = 12) -> str:
    text = path.read_text(encoding="utf-8", errors="replace").splitlines()
    return "\n".join(text[-lines:])


def _die_with_parent() -> None:
    """Linux: the trial gets SIGTERM (save last.ckpt and stop) if the sweep process dies."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _stop(proc: subprocess.Popen, grace: float = 30.0) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout=grace)
    except (subprocess.TimeoutExpired, KeyboardInterrupt):
        proc.kill()
        proc.wait()
