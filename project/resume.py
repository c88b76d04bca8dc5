"""``python -m project resume [RUN_DIR] [overrides]`` (``make resume``): continue a run from its
``last.ckpt`` in the same folder, with the config it was started with."""

from __future__ import annotations

import logging
from pathlib import Path

from project.cli import ProjectCLI
from project.runs import newest_checkpoint, newest_run, run_config

log = logging.getLogger("project")


def main(argv: list[str]) -> int:
    """``resume [RUN_DIR] [overrides]``: continue a run from its ``last.ckpt``, same folder."""
    if argv and argv[0] in ("-h", "--help"):
        print("usage: python -m project resume [RUN_DIR] [--key=value ...]\n\n"
              "Continue a run (default: the newest under logs/) from its last.ckpt in the same folder,\n"
              "with its own config.yaml; overrides as for fit (python -m project fit --help).")
        raise SystemExit(0)  # as argparse's --help of the other commands
    explicit = argv[0] if argv and not argv[0].startswith("-") else None
    run = Path(explicit) if explicit else newest_run()
    ckpt = newest_checkpoint(run)
    log.info("Resuming %s from %s", run, ckpt)
    ProjectCLI(args=["fit", "--config", str(run_config(run)), f"--ckpt_path={ckpt}",
                     *(argv[1:] if explicit else argv)], run_dir=run)
    return 0

