"""Errors a user can fix; the CLI prints them as one line instead of a traceback."""

import errno


class ProjectError(Exception):
    """Base of the errors whose message names the file or setting and the fix."""


class ConfigError(ProjectError, ValueError):
    """A setting that cannot work."""


class CheckpointError(ProjectError, ValueError):
    """A checkpoint that is missing, unreadable, or does not fit the data."""


DISK_FULL_FIX = ("free some space and run the command again (a stopped training run goes on with "
                 "`python -m project resume`)")


class DiskFullError(ProjectError):
    """A write that found no room (raised by the atomic writer, so nothing half-written is left)."""


def disk_full(err: BaseException) -> OSError | None:
    """The "no space left" (or over quota) error behind ``err``, if any: torch's writer raises a
    RuntimeError about its position, with the OSError only in the chain."""
    seen: BaseException | None = err
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno in (errno.ENOSPC, errno.EDQUOT):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


def require(ok: bool, key: str, rule: str, value: object) -> None:
    """Raise a one-line :class:`ConfigError` naming ``key`` when a setting is out of range."""
    if not ok:
        raise ConfigError(f"{key} {rule}, got {value!r}")


def require_all(*rows: tuple[bool, str, str, object]) -> None:
    """A table of :func:`require` checks, one ``(ok, key, rule, value)`` row each, in order."""
    for row in rows:
        require(*row)
