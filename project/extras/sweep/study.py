"""The Optuna study: where it is stored, how it prunes, and the check that keeps it one search.

``--storage`` picks where the study lives, and so who can share it:

- nothing: an SQLite file beside the runs (``logs/sweeps/<study>.db``), for one worker. SQLite
  locks the whole file for each write, so several busy workers wait on each other, and it is not
  safe on a network file system.
- a file path (``logs/sweeps/study.log``): Optuna's journal storage, an append-only log that
  several processes on one machine share without a server.
- a database URL (``postgresql://user:password@host/db``): Optuna's RDB storage, for workers on
  several machines.

How workers claim trials and notice a dead one is in ``workers.py``.
"""

from __future__ import annotations

import contextlib
import os
import warnings
from collections.abc import Iterator
from pathlib import Path

import optuna
from optuna.storages import BaseStorage, RDBStorage
from optuna.storages.journal import JournalFileBackend, JournalStorage

from project.errors import ConfigError

SWEEP_ROOT = Path("logs/sweeps")
PRUNERS = ("median", "halving", "none")
SQLITE_SUFFIXES = (".db", ".sqlite", ".sqlite3")

# the journal file backend is marked experimental; it is what --storage PATH uses
warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
optuna.logging.set_verbosity(optuna.logging.ERROR)  # the sweep prints its own lines per trial


def storage_url(study: str, storage: str | None = None, root: Path = SWEEP_ROOT) -> str:
    """``storage`` as given (a database URL), the absolute path of a journal file, or the
    default ``sqlite:///<root>/<study>.db``; absolute, so trial processes and other working
    folders find the same file."""
    if storage is None:
        root.mkdir(parents=True, exist_ok=True)
        return f"sqlite:///{(root / f'{study}.db').resolve()}"
    if "://" in storage:
        scheme, _, rest = storage.partition("://")
        # the driver the project installs (psycopg2-binary); SQLAlchemy's default may be another
        return f"postgresql+psycopg2://{rest}" if scheme in ("postgresql", "postgres") else storage
    if Path(storage).suffix in SQLITE_SUFFIXES:
        raise ConfigError(f"--storage {storage!r} looks like an SQLite file: pass sqlite:///{storage} "
                          "for SQLite, or a path such as logs/sweeps/study.log for a journal file")
    return str(Path(storage).resolve())


def shown(url: str) -> str:
    """The storage as printed: a database URL without its password."""
    if "://" not in url:
        return f"journal file {url}"
    from sqlalchemy.engine import make_url

    return make_url(url).render_as_string(hide_password=True)


def open_storage(url: str) -> BaseStorage:
    """The study's storage: a journal file, or a database (SQLite waits up to a minute for a
    lock); one line naming the storage if it cannot be opened."""
    if "://" not in url:
        Path(url).parent.mkdir(parents=True, exist_ok=True)
        return JournalStorage(JournalFileBackend(url))
    engine = {"connect_args": {"timeout": 60}} if url.startswith("sqlite") else {"pool_pre_ping": True}
    with database_errors(url):
        return RDBStorage(url, engine_kwargs=engine)


@contextlib.contextmanager
def database_errors(url: str) -> Iterator[None]:
    """A database that cannot be reached or used becomes one line naming it (password hidden)."""
    import sqlalchemy.exc

    try:
        yield
    except (sqlalchemy.exc.SQLAlchemyError, ImportError) as err:
        reason = str(getattr(err, "orig", None) or err).strip().splitlines()[0]
        raise ConfigError(f"cannot open the study database {shown(url)}: {reason} (check --storage: "
                          "the host, port, user, password and database name, and that the "
                          "database's driver is installed, e.g. psycopg2-binary)") from err


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


def open_study(name: str, storage: BaseStorage, direction: str, pruner: str,
               sampler_seed: int | None = None) -> optuna.Study:
    """Create the study, or load it to continue (an interrupted sweep, another worker)."""
    # A fixed seed would repeat the same first samples after a restart: offset it by the trials done.
    seed = None if sampler_seed is None else sampler_seed + _trial_count(storage, name)
    # constant_liar: a worker's TPE treats trials still running elsewhere as poor, so workers
    # started at once do not all sample the same promising region
    sampler = optuna.samplers.TPESampler(seed=seed, n_startup_trials=5, multivariate=True,
                                         constant_liar=True)
    study = optuna.create_study(study_name=name, storage=storage, direction=direction,
                                sampler=sampler, pruner=make_pruner(pruner), load_if_exists=True)
    if study.direction.name.lower() != direction:
        raise ConfigError(f"study '{name}' was created to {study.direction.name.lower()} "
                          f"its metric; pass --direction {study.direction.name.lower()} or a new --study")
    return study


def storage_file(url: str) -> Path | None:
    """The file a journal or SQLite storage lives in; None for a database server."""
    if "://" not in url:
        return Path(url)
    if url.startswith("sqlite:///"):
        return Path(url.removeprefix("sqlite:///"))
    return None


def check_storage_folder(url: str) -> None:
    """A journal or SQLite file's folder exists or is made now, and is writable; else one line
    naming --storage, before any trial, run folder or lock file (the first claim would fail on
    its lock file with a traceback). Folders made here are removed again if a deeper one fails."""
    path = storage_file(url)
    if path is None:
        return
    given = shown(url) if "://" in url else str(path)
    example = "sqlite:///logs/sweeps/study.db" if "://" in url else "logs/sweeps/study.log"
    fix = f"pass a file in a folder you can write, e.g. --storage {example}"
    if path.is_dir():
        raise ConfigError(f"--storage {given} is a folder, not a file: {fix}")
    folder = path.parent
    missing = [f for f in (folder, *folder.parents) if not f.exists()]
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        for made in missing:  # deepest first
            with contextlib.suppress(OSError):
                made.rmdir()
        raise ConfigError(f"--storage {given}: its folder {folder} cannot be made "
                          f"({err.strerror}): {fix}") from None
    if not os.access(folder, os.W_OK | os.X_OK):
        raise ConfigError(f"--storage {given}: its folder {folder} is not writable: {fix}")


def load_study(name: str, url: str) -> optuna.Study:
    """An existing study, to report on; one line if there is none by that name."""
    path = storage_file(url)
    if path is not None and not path.is_file():
        raise ConfigError(f"no study storage at {shown(url)}: pass the --study and --storage the "
                          "sweep's workers were started with")
    try:
        return optuna.load_study(study_name=name, storage=open_storage(url))
    except KeyError as err:
        raise ConfigError(f"no study '{name}' in {shown(url)}: pass the --study the workers were "
                          "started with (the sweep file's name by default)") from err


def _trial_count(storage: BaseStorage, name: str) -> int:
    try:
        return storage.get_n_trials(storage.get_study_id_from_name(name))
    except KeyError:
        return 0


def check_same_settings(study: optuna.Study, settings: dict) -> None:
    """A study continues only with the settings it was started with: mixing trials of other data
    or another space would make its best trial meaningless. ``settings["config"]`` holds every
    training setting as parsed, so an edited config file counts and a respelt argument does not."""
    stored = study.user_attrs.get("settings")
    if stored is None:
        study.set_user_attr("settings", settings)
        return
    skip = {"fit_args"} if "config" in stored else {"config"}  # a study of an earlier version: its arguments
    was, now = flat_settings(stored, skip), flat_settings(settings, skip)
    searched = [f"config.{p['key']}" for p in settings.get("space", [])]  # each trial sets its own
    ignored = searched + list(RUNTIME)
    changed = sorted(k for k in set(was) | set(now) if was.get(k) != now.get(k)
                     and not (k.startswith("config.") and k not in was)  # a setting a later version added
                     and not any(k == i or k.startswith(f"{i}.") for i in ignored))
    if changed:
        lines = [f"  {k}: was {was.get(k)!r}, now {now.get(k)!r}" for k in changed[:12]]
        more = f"\n  ... and {len(changed) - 12} more" if len(changed) > 12 else ""
        raise ConfigError(f"study '{study.study_name}' was started with other settings:\n"
                          + "\n".join(lines) + more + "\nrun it with the same settings to continue "
                          "it, or pass --study NEW_NAME for a new study")


# settings that change how fast a trial runs or what it prints, not its result: workers may differ
RUNTIME = tuple(f"config.{k}" for k in ("data.num_workers", "data.pin_memory", "data.persistent_workers",
                                        "data.prefetch_factor", "trainer.enable_progress_bar",
                                        "trainer.enable_model_summary", "trainer.logger"))


def flat_settings(settings: dict, skip: set[str]) -> dict:
    """The stored settings with the training config's entries as ``config.model.lr`` and so on."""
    out = {k: v for k, v in settings.items() if k not in skip | {"config"}}
    if "config" not in skip:
        out.update({f"config.{k}": v for k, v in (settings.get("config") or {}).items()})
    return out


def check_trial_folders(study: optuna.Study, folder: Path, url: str) -> None:
    """Trial folders numbered past the study's trials are another study's of the same name (its
    storage deleted or elsewhere): a new trial would write its run into one, beside the old."""
    found = [p for p in folder.glob("trial_[0-9][0-9][0-9]") if p.is_dir() and any(p.iterdir())]
    count = len(study.trials)  # after the listing: another worker's new folder has its trial by then
    stale = sorted(p.name for p in found if int(p.name[6:]) >= count)
    if stale:
        named = ", ".join(stale[:3]) + (", ..." if len(stale) > 3 else "")
        raise ConfigError(f"{folder}/ holds run folders ({named}) of trials that study "
                          f"'{study.study_name}' in {shown(url)} does not have: move them away, or "
                          "pass --study NEW_NAME")
