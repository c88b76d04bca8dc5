"""The project's own commands (``python -m project NAME``, beside LightningCLI's fit, validate
and test): one table, each module imported only when its command runs. Loaded by ``project.cli``
only for a word that is not one of Lightning's (or for ``--help``)."""

import difflib
import importlib

from project.errors import ConfigError

# command -> "module:function"; each module is imported only when its command runs
COMMANDS = {
    "resume": "project.resume:main",
    "evaluate": "project.extras.analysis.evaluate:main",
    "calibrate": "project.extras.analysis.calibration:main",
    "suspects": "project.extras.analysis.suspects:main",
    "predict": "project.extras.deploy.predict:main",
    "export": "project.extras.deploy.export:main",
    "serve": "project.extras.deploy.serve:main",
    "check-data": "project.extras.datatools.check_data:main",
    "resize-data": "project.extras.datatools.resize:main",
    "optimize-data": "project.extras.streaming.optimize:main",
    "overfit": "project.extras.diagnose.tools:overfit",
    "lr-find": "project.extras.diagnose.tools:lr_find",
    "find-batch-size": "project.extras.diagnose.tools:find_batch_size",
    "models": "project.extras.zoo:main",
    "sweep": "project.extras.sweep.command:main",
    "suggest": "project.extras.suggest.command:main",
    "embed": "project.extras.embeddings.command:embed_main",
    "probe": "project.extras.embeddings.command:probe_main",
    "init": "project.extras.datatools.init:main",
}


def run(argv: list[str], lightning: tuple[str, ...]) -> int | None:
    """Run ``argv``'s command; None: LightningCLI's to run (``lightning``: its subcommands), or
    its help to print after ours."""
    if not argv or argv[0] in ("-h", "--help"):
        print("Project commands (each takes --help): " + ", ".join(COMMANDS) +
              "\nLightningCLI subcommands follow.\n")
        return None
    if argv[0] not in COMMANDS:
        raise ConfigError(unknown_command(argv[0], lightning))
    return load_command(argv[0])(argv[1:]) or 0


def unknown_command(word: str, lightning: tuple[str, ...]) -> str:
    """Why ``word`` runs nothing, with the nearest command names (LightningCLI's own message
    would list only fit, validate and test)."""
    names = [*lightning, *COMMANDS]
    close = difflib.get_close_matches(word, names, n=2, cutoff=0.5)
    guess = f"; did you mean {' or '.join(close)}?" if close else "."
    return f"'{word}' is not a command{guess} Commands: {', '.join(names)}"


def load_command(name: str):
    """The function of COMMANDS[name], imported now; a module that does not import (a missing
    package, a syntax error) or a misspelt function is one line naming the command and the cause."""
    module, _, function = COMMANDS[name].partition(":")
    try:
        return getattr(importlib.import_module(module), function)
    except (ImportError, SyntaxError, AttributeError) as err:
        cause = " ".join(f"{type(err).__name__}: {err}".split())
        raise ConfigError(f"command '{name}' cannot start: {COMMANDS[name]} does not load ({cause}); "
                          "reinstall the project (pip install -e .) or fix that entry") from None
