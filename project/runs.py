"""Find runs and their checkpoints under ``logs/``: the newest run, its last and best files."""

from __future__ import annotations

from pathlib import Path

from project.errors import ProjectError

LOG_ROOT = Path("logs")


class RunNotFoundError(ProjectError, FileNotFoundError):
    """No run or checkpoint where one was expected; the message says what to run first."""


def run_dirs(root: Path = LOG_ROOT) -> list[Path]:
    """Run folders (those holding a ``checkpoints/`` folder), oldest first by modification."""
    if not root.is_dir():
        return []
    runs = {p.parent.parent for p in root.rglob("checkpoints/*.ckpt")}
    runs = {r for r in runs if checkpoints(r)}  # not only a half-written temporary file
    return sorted(runs, key=lambda r: max(f.stat().st_mtime for f in checkpoints(r)))


def checkpoints(run: Path, pattern: str = "*.ckpt") -> list[Path]:
    """The complete checkpoint files of ``run`` (temporary ``.name.tmp.ckpt`` files excluded)."""
    return [p for p in (run / "checkpoints").glob(pattern) if not p.name.startswith(".")]


def newest_run(root: Path = LOG_ROOT) -> Path:
    runs = run_dirs(root)
    if not runs:
        raise RunNotFoundError(f"no run with checkpoints under '{root}/': train first (make train)")
    return runs[-1]


def last_checkpoint(run: Path) -> Path:
    path = run / "checkpoints" / "last.ckpt"
    if not path.is_file():
        raise RunNotFoundError(
            f"'{path}' does not exist, so there is nothing to resume from; start a new run "
            "with `make train` instead"
        )
    return path


def best_checkpoint(run: Path) -> Path:
    """The checkpoint kept for the best monitored metric (``best-*.ckpt``), else ``last.ckpt``."""
    best = sorted(checkpoints(run, "best-*.ckpt"), key=lambda p: p.stat().st_mtime)
    return best[-1] if best else last_checkpoint(run)


def resolve_checkpoint(spec: str | None, root: Path = LOG_ROOT) -> Path:
    """``best`` / ``last`` / None (the newest run's best) / a path, checked to exist."""
    if spec in (None, "", "best"):
        return best_checkpoint(newest_run(root))
    if spec == "last":
        return last_checkpoint(newest_run(root))
    path = Path(spec)
    if path.is_dir():  # a run folder
        return best_checkpoint(path)
    if not path.is_file():
        raise RunNotFoundError(f"checkpoint '{path}' does not exist")
    return path
