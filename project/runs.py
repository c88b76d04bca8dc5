"""Runs under ``logs/``: the newest run, its last and best checkpoints, where loggers write,
and the command-line options that name them."""

from __future__ import annotations

import logging
from pathlib import Path

from jsonargparse import Namespace

from project.common.argv import pop_option
from project.errors import ConfigError, ProjectError

LOG_ROOT = Path("logs")
log = logging.getLogger("project")


class RunNotFoundError(ProjectError, FileNotFoundError):
    """No run or checkpoint where one was expected; the message says what to run first."""


def checkpoints(run: Path, pattern: str = "*.ckpt") -> list[Path]:
    """The complete checkpoint files of ``run`` (temporary ``.name.tmp.ckpt`` files excluded)."""
    return [p for p in (run / "checkpoints").glob(pattern) if not p.name.startswith(".")]


def run_dirs(root: Path = LOG_ROOT) -> list[Path]:
    """Run folders (those holding checkpoints), oldest first by their newest checkpoint."""
    if not root.is_dir():
        return []
    runs = {p.parent.parent for p in root.rglob("checkpoints/*.ckpt")}
    runs = {r for r in runs if checkpoints(r)}
    return sorted(runs, key=lambda r: max(f.stat().st_mtime for f in checkpoints(r)))


def newest_run(root: Path = LOG_ROOT) -> Path:
    runs = run_dirs(root)
    if not runs:
        raise RunNotFoundError(f"no run with checkpoints under '{root}/': train first (make train)")
    return runs[-1]


def run_config(run: Path) -> Path:
    config = run / "config.yaml"
    if not config.is_file():
        raise RunNotFoundError(f"'{config}' is missing, so the run's settings are unknown")
    return config


def last_checkpoint(run: Path) -> Path:
    path = run / "checkpoints" / "last.ckpt"
    if not path.is_file():
        raise RunNotFoundError(f"'{path}' does not exist, so there is nothing to resume from; start "
                               "a new run with `make train` instead")
    return path


def newest_checkpoint(run: Path) -> Path:
    """``last.ckpt``; without it (a disk that filled as it was written), the run's newest other
    checkpoint: each holds the whole training state of its epoch (what resume continues)."""
    try:
        return last_checkpoint(run)
    except RunNotFoundError:
        saved = sorted(checkpoints(run), key=lambda p: p.stat().st_mtime)
        if not saved:
            raise
        log.info("Notice: %s has no last.ckpt; resuming from its newest checkpoint, %s", run, saved[-1].name)
        return saved[-1]


def default_out_dir(ckpt: Path) -> Path:
    """Where export writes a checkpoint's files: exports/<run folder relative to logs/>, e.g.
    exports/demo/version_0."""
    run = ckpt.parent.parent
    try:
        return Path("exports") / run.resolve().relative_to(LOG_ROOT.resolve())
    except ValueError:
        return Path("exports") / ckpt.stem


def best_checkpoint(run: Path) -> Path:
    """The checkpoint kept for the best monitored metric (``best-*.ckpt``), else ``last.ckpt``."""
    best = sorted(checkpoints(run, "best-*.ckpt"), key=lambda p: p.stat().st_mtime)
    if best:
        return best[-1]
    if not (run / "checkpoints" / "last.ckpt").is_file():  # not a run folder, or one before its first epoch
        raise RunNotFoundError(f"'{run}' holds no checkpoint (no {run / 'checkpoints'}/best-*.ckpt or "
                               "last.ckpt): give a run folder under logs/ that trained an epoch, or a .ckpt")
    return last_checkpoint(run)


def resolve_checkpoint(spec: str | None, root: Path = LOG_ROOT) -> Path:
    """``best`` / ``last`` / None (the newest run's best) / a run folder / a file, checked to
    exist and to be a checkpoint of this project (one reader for every command)."""
    if spec in (None, "", "best"):
        path = best_checkpoint(newest_run(root))
    elif spec == "last":
        path = last_checkpoint(newest_run(root))
    elif Path(spec).is_dir():
        path = best_checkpoint(Path(spec))
    else:
        path = Path(spec)
    from project.checkpoints import read_checkpoint

    read_checkpoint(path, mmap=True)  # one line of error for a missing or foreign file
    return path


def resolve_ckpt_alias(argv: list[str]) -> list[str]:
    """``--ckpt_path best|last`` for validate/test means the newest run's file."""
    rest, ckpt = pop_option(argv, "--ckpt_path")
    if ckpt in ("best", "last"):
        ckpt = str(resolve_checkpoint(ckpt))
    return rest + ([f"--ckpt_path={ckpt}"] if ckpt else [])


def place_loggers(trainer: Namespace, run_dir: Path | None, new_run: bool = False) -> None:
    """Every logger writes to one run folder: ``run_dir`` (resume, evaluate, a sweep trial) or,
    for a new run with several loggers, the first one's next ``version_N``. A single logger of a
    new run is left to Lightning. A new run is not put where another's checkpoints are."""
    if new_run and run_dir is not None and checkpoints(run_dir):
        raise ConfigError(f"--run_dir '{run_dir}' holds another run's checkpoints: a new run there would mix "
                          f"its checkpoints and config with that one's; resume it (python -m project resume "
                          f"{run_dir}) or give a new folder")
    items = trainer.get("logger")
    items = items if isinstance(items, list) else [items]
    placeable = [lg for lg in items if isinstance(lg, Namespace)
                 and isinstance(lg.get("init_args"), Namespace)
                 and {"save_dir", "name", "version"} <= set(lg.init_args.keys())]
    if not placeable or (run_dir is None and len(placeable) < 2):
        return
    if run_dir is None:
        first = placeable[0].init_args
        root = Path(first.save_dir or ".") / (first.name or "")
        run_dir = root / (str(first.version) if first.version is not None else next_version(root))
    for lg in placeable:
        lg.init_args.save_dir, lg.init_args.name, lg.init_args.version = str(run_dir.parent), "", run_dir.name


def next_version(root: Path) -> str:
    taken = [int(p.name[8:]) for p in root.glob("version_*") if p.name[8:].isdigit()] if root.is_dir() else []
    return f"version_{max(taken, default=-1) + 1}"



def keep_csv_rows(run_dir: Path) -> None:
    """Into a run folder that has one (resume, ``--run_dir``): the CSV logger deletes its
    ``metrics.csv``, so the rows so far are kept beside it."""
    csv_log = run_dir / "metrics.csv"
    if csv_log.is_file():
        kept = csv_log.with_name(f"metrics-{len(list(run_dir.glob('metrics*.csv'))) - 1}.csv")
        csv_log.rename(kept)
        log.info("Notice: the CSV logger starts metrics.csv afresh; the rows so far are in %s", kept)
