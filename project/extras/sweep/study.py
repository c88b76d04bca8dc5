"""The Optuna study: where it is stored, how it prunes, and how workers share it.

The default storage is an SQLite file beside the runs (``logs/sweeps/<study>.db``); any
SQLAlchemy database URL works too, so workers on several machines can share one study.
Each running trial sends a heartbeat; a trial whose worker died (killed, machine lost) is
marked FAIL once its heartbeat is older than the grace period, and its parameters are queued
again once (Optuna's retry callback), so nothing is lost and nothing is repeated.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import optuna
from optuna.storages import RDBStorage

from project.errors import ConfigError

SWEEP_ROOT = Path("logs/sweeps")
# Optuna 4.9 renamed the callback that re-queues a dead worker's trial
_Retry = (getattr(optuna.storages, "RetryHeartbeatStaleTrialCallback", None)
          or optuna.storages.RetryFailedTrialCallback)
PRUNERS = ("median", "halving", "none")

# fail_stale_trials and the heartbeat are marked experimental; they are what this module uses
warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
optuna.logging.set_verbosity(optuna.logging.ERROR)  # the sweep prints its own lines per trial


def storage_url(study: str, storage: str | None = None, root: Path = SWEEP_ROOT) -> str:
    """``storage`` as given (a database URL), else ``sqlite:///<root>/<study>.db`` (absolute,
    so trial processes and other working folders find the same file)."""
    if storage:
        if "://" not in storage:
            raise ConfigError(f"--storage {storage!r} is not a database URL; use e.g. "
                              "sqlite:////shared/sweeps.db or postgresql://user@host/db")
        return storage
    root.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{(root / f'{study}.db').resolve()}"


def open_storage(url: str, heartbeat: int | None = None) -> RDBStorage:
    """The study database. SQLite waits up to a minute for a lock (several workers write to it);
    ``heartbeat`` (seconds) turns on dead-worker detection with a grace period of 3 beats."""
    engine = {"connect_args": {"timeout": 60}} if url.startswith("sqlite") else {"pool_pre_ping": True}
    if not heartbeat:
        return RDBStorage(url, engine_kwargs=engine)
    return RDBStorage(url, engine_kwargs=engine, heartbeat_interval=heartbeat, grace_period=3 * heartbeat,
                      heartbeat_stale_trial_callback=_Retry(max_retry=1))


def make_pruner(spec: str) -> optuna.pruners.BasePruner:
    """``median[:startup[:warmup]]``, ``halving[:warmup]`` or ``none``.

    median: after ``warmup`` epochs, stop a trial whose best value so far is worse than the
    median of the earlier trials at the same epoch, once ``startup`` trials have finished.
    halving: successive halving (asynchronous), keeping the top third at each rung.
    """
    name, *nums = spec.split(":")
    try:
        values = [int(n) for n in nums]
    except ValueError:
        values = None
    if name not in PRUNERS or values is None or any(v < 0 for v in values):
        raise ConfigError(f"--pruner {spec!r} is not valid: use median[:STARTUP[:WARMUP]], "
                          "halving[:WARMUP] or none, e.g. median:3:1")
    if name == "median":
        startup, warmup = (values + [3, 1][len(values):])[:2]
        return optuna.pruners.MedianPruner(n_startup_trials=startup, n_warmup_steps=warmup)
    if name == "halving":
        warmup = values[0] if values else 1
        return optuna.pruners.SuccessiveHalvingPruner(min_resource=max(1, warmup), reduction_factor=3)
    return optuna.pruners.NopPruner()


def open_study(name: str, url: str, direction: str, pruner: str, heartbeat: int | None = None,
               sampler_seed: int | None = None) -> optuna.Study:
    """Create the study, or load it to continue (an interrupted sweep, another worker)."""
    storage = open_storage(url, heartbeat)
    # A fixed seed would repeat the same first samples after a restart: offset it by the trials done.
    seed = None if sampler_seed is None else sampler_seed + _trial_count(storage, name)
    sampler = optuna.samplers.TPESampler(seed=seed, n_startup_trials=5, multivariate=True)
    study = optuna.create_study(study_name=name, storage=storage, direction=direction,
                                sampler=sampler, pruner=make_pruner(pruner), load_if_exists=True)
    if study.direction.name.lower() != direction:
        raise ConfigError(f"study '{name}' in {url} was created to {study.direction.name.lower()} "
                          f"its metric; pass --direction {study.direction.name.lower()} or a new --study")
    return study


def _trial_count(storage: RDBStorage, name: str) -> int:
    try:
        return storage.get_n_trials(storage.get_study_id_from_name(name))
    except KeyError:
        return 0


def check_same_settings(study: optuna.Study, settings: dict) -> None:
    """A study continues only with the arguments it was started with: mixing trials of other
    data or another space would make its best trial meaningless."""
    stored = study.user_attrs.get("settings")
    if stored is None:
        study.set_user_attr("settings", settings)
        return
    changed = sorted(k for k in set(stored) | set(settings) if stored.get(k) != settings.get(k))
    if changed:
        lines = [f"  {k}: was {stored.get(k)!r}, now {settings.get(k)!r}" for k in changed]
        raise ConfigError(f"study '{study.study_name}' was started with other settings:\n"
                          + "\n".join(lines) + "\nrun it with the same arguments to continue it, "
                          "or pass --study NEW_NAME for a new study")
