"""Command line: LightningCLI for fit/validate/test, plus the project's own commands.

    python -m project fit --config configs/train.yaml [--trainer.max_epochs=5 ...]
    python -m project resume [RUN_DIR] [overrides]
    python -m project test --config configs/train.yaml --ckpt_path best|last|PATH
    python -m project evaluate [CKPT_OR_RUN_DIR] [--tta hflip]
    python -m project models [PATTERN] [--pretrained]
    python -m project calibrate [--ckpt_path best]      temperature scaling on the validation set
    python -m project suspects [--folds 3] [overrides]   training images with doubtful labels
"""

from __future__ import annotations

import logging
import sys
import warnings
from collections.abc import Callable
from pathlib import Path

import torch
import yaml
from jsonargparse import Namespace
from lightning.pytorch.cli import LightningCLI, SaveConfigCallback

from project.callbacks import REQUIRED_CALLBACKS, guard_callbacks
from project.checkpoints import check_checkpoint_classes
from project.data import FolderDataModule
from project.errors import CheckpointError, ProjectError
from project.model import ImageClassifier
from project.model.backbones import weights_preprocessing
from project.model.recipe import check_tta
from project.runs import last_checkpoint, newest_run, resolve_checkpoint

log = logging.getLogger("project")


class FitConfigSaver(SaveConfigCallback):
    """Save ``config.yaml`` into the run folder for ``fit`` only (a resume rewrites it)."""

    def setup(self, trainer, pl_module, stage: str) -> None:
        if stage == "fit":
            super().setup(trainer, pl_module, stage)


class ProjectCLI(LightningCLI):
    def __init__(self, args: list[str] | None = None, run: bool = True, tool: bool = False,
                 model_overrides: dict | None = None) -> None:
        """``tool``: a diagnosis run (overfit, LR finder): guards only, no saved config.
        ``model_overrides``: model settings that win over a checkpoint's stored ones (Lightning
        takes ``model.*`` from ``--ckpt_path``'s hyperparameters, above the command line)."""
        self.tool = tool
        self.model_overrides = model_overrides or {}
        super().__init__(
            ImageClassifier,
            FolderDataModule,
            seed_everything_default=42,
            save_config_callback=None if tool else FitConfigSaver,
            save_config_kwargs={"overwrite": True},
            trainer_defaults={"callbacks": guard_callbacks()} if tool else {},
            auto_configure_optimizers=False,
            args=args,
            run=run,
        )

    def add_arguments_to_parser(self, parser) -> None:
        # The data decides the classes and the input size; the model stores them for export.
        parser.link_arguments("data.num_classes", "model.num_classes", apply_on="instantiate")
        parser.link_arguments("data.class_names", "model.class_names", apply_on="instantiate")
        parser.link_arguments("data.image_size", "model.image_size")

    @staticmethod
    def subcommands() -> dict[str, set[str]]:
        """fit, validate, test. Lightning's ``predict`` is left out: ``python -m project predict``
        is the project's own command (a CSV of predictions for a folder of images)."""
        return {k: v for k, v in LightningCLI.subcommands().items() if k != "predict"}

    def before_instantiate_classes(self) -> None:
        if self.tool:
            return
        config = self.config[self.subcommand] if self.subcommand else self.config
        for key, value in self.model_overrides.items():
            config.model[key] = value
        self._preprocessing_from_weights(config)
        trainer = config.trainer
        self._add_required_callbacks(trainer)
        if trainer.get("sync_batchnorm") and not _on_gpu(trainer.get("accelerator")):
            log.info("Notice: trainer.sync_batchnorm turned off: SyncBatchNorm needs GPUs, and "
                     "this run is on the CPU (each process keeps its own BatchNorm statistics).")
            trainer.sync_batchnorm = False

    @staticmethod
    def _preprocessing_from_weights(config: Namespace) -> None:
        """Unset ``data.crop_ratio/interpolation/mean/std`` take the pretrained weights' values;
        the model gets the same, so checkpoint, export and predict repeat them."""
        resolved = weights_preprocessing(config.model.backbone, config.model.weights)
        for key, value in resolved.items():
            if config.data.get(key) is None:
                config.data[key] = value
            config.model[key] = config.data[key]

    @staticmethod
    def _add_required_callbacks(trainer: Namespace) -> None:
        """The guards of a correct run stay on even if a config leaves them out, and the run
        says which it added (configs/train.yaml lists them all)."""
        callbacks = list(trainer.get("callbacks") or [])
        present = {getattr(c, "class_path", type(c).__module__ + "." + type(c).__name__)
                   for c in callbacks}
        missing = [path for path in REQUIRED_CALLBACKS if path not in present]
        if missing:
            log.info("Notice: added callbacks that every training run needs but the config lacks: "
                     "%s", ", ".join(p.rsplit(".", 1)[1] for p in missing))
            callbacks += [Namespace(class_path=p, init_args=Namespace()) for p in missing]
            trainer.callbacks = callbacks

    def _check_checkpoint(self, subcommand: str) -> None:
        ckpt = self.config_init[subcommand].get("ckpt_path")
        if ckpt:
            check_checkpoint_classes(Path(ckpt), self.datamodule.class_names)

    def before_fit(self) -> None:
        self._check_checkpoint("fit")

    def before_validate(self) -> None:
        self._check_checkpoint("validate")

    def before_test(self) -> None:
        self._check_checkpoint("test")


def _on_gpu(accelerator: object) -> bool:
    """Whether an ``accelerator`` setting ends up on CUDA GPUs."""
    name = str(getattr(accelerator, "class_path", accelerator) or "auto").lower()
    return torch.cuda.is_available() and ("cpu" not in name)


def _run_args(run: Path) -> list[str]:
    """Arguments that make a new invocation write into the existing run folder ``run``."""
    config = run / "config.yaml"
    if not config.is_file():
        raise CheckpointError(f"'{config}' is missing, so the run's settings are unknown")
    return ["--config", str(config), f"--trainer.logger.init_args.version={run.name}"]


def resume(argv: list[str]) -> int:
    """``resume [RUN_DIR] [overrides]``: continue a run from its ``last.ckpt``, same folder."""
    explicit = argv[0] if argv and not argv[0].startswith("-") else None
    run = Path(explicit) if explicit else newest_run()
    ckpt = last_checkpoint(run)
    overrides = argv[1:] if explicit else argv
    log.info("Resuming %s from %s", run, ckpt)
    ProjectCLI(args=["fit", *_run_args(run), f"--ckpt_path={ckpt}", *overrides])
    return 0


def evaluate(argv: list[str]) -> int:
    """``evaluate [CKPT_OR_RUN_DIR|best|last] [overrides]``: test with the run's own config."""
    spec = argv[0] if argv and not argv[0].startswith("-") else None
    ckpt = resolve_checkpoint(spec)
    run = ckpt.parent.parent
    overrides, tta = _pop_option(argv[1:] if spec else argv, "--tta")
    if tta:
        config = yaml.safe_load((run / "config.yaml").read_text()) if (run / "config.yaml").is_file() else {}
        check_tta(tta, (config.get("data") or {}).get("hflip"))
    ProjectCLI(args=["test", *_run_args(run), f"--ckpt_path={ckpt}", "--verbose=false", *overrides],
               model_overrides={"tta": tta} if tta else None)
    return 0


def _pop_option(argv: list[str], name: str) -> tuple[list[str], str | None]:
    """``argv`` without ``name VALUE`` / ``name=VALUE``, and that value."""
    rest, value, i = [], None, 0
    while i < len(argv):
        if argv[i] == name and i + 1 < len(argv):
            value, i = argv[i + 1], i + 2
            continue
        if argv[i].startswith(name + "="):
            value = argv[i].split("=", 1)[1]
        else:
            rest.append(argv[i])
        i += 1
    return rest, value


def _resolve_ckpt_alias(argv: list[str]) -> list[str]:
    """``--ckpt_path best|last`` for validate/test means the newest run's file."""
    if not argv or argv[0] not in ("validate", "test"):
        return argv
    out = list(argv)
    for i, arg in enumerate(out):
        if arg == "--ckpt_path" and i + 1 < len(out) and out[i + 1] in ("best", "last"):
            out[i + 1] = str(resolve_checkpoint(out[i + 1]))
        elif arg in ("--ckpt_path=best", "--ckpt_path=last"):
            out[i] = f"--ckpt_path={resolve_checkpoint(arg.split('=', 1)[1])}"
    return out


def _lazy(module: str, name: str = "main") -> Callable[[list[str]], int]:
    def run(argv: list[str]) -> int:
        import importlib

        return getattr(importlib.import_module(module), name)(argv)

    return run


COMMANDS: dict[str, Callable[[list[str]], int]] = {
    "resume": resume,
    "evaluate": evaluate,
    "predict": _lazy("project.deploy.predict"),
    "export": _lazy("project.deploy.export"),
    "check-data": _lazy("project.diagnose.check_data"),
    "resize-data": _lazy("project.data.resize"),
    "optimize-data": _lazy("project.data.optimize"),
    "models": _lazy("project.model.zoo"),
    "overfit": _lazy("project.diagnose.tools", "overfit"),
    "lr-find": _lazy("project.diagnose.tools", "lr_find"),
    "find-batch-size": _lazy("project.diagnose.tools", "find_batch_size"),
    "sweep": _lazy("project.sweep.command"),
    "calibrate": _lazy("project.model.calibration"),
    "suspects": _lazy("project.diagnose.suspects"),
}


class _DropAdverts(logging.Filter):
    """Lightning 2.6 prints a cloud-service tip on every run; it is not about this run."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "Tip: For seamless cloud logging" not in record.getMessage()


def setup_logging() -> None:
    # main() passes its arguments on explicitly (after resolving aliases): not a mistake.
    warnings.filterwarnings("ignore", message="LightningCLI's args parameter")
    # raised inside Lightning with this torch version; nothing a user can act on
    warnings.filterwarnings("ignore", message=".*isinstance\\(treespec, LeafSpec\\)")
    logging.getLogger("lightning.pytorch.utilities.rank_zero").addFilter(_DropAdverts())
    logger = logging.getLogger("project")
    if not logger.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(message)s"))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        logger.propagate = False


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    setup_logging()
    try:
        if not argv or argv[0] in ("-h", "--help"):
            print("Project commands (each takes --help): " + ", ".join(COMMANDS) +
                  "\nLightningCLI subcommands follow.\n")
        if argv and argv[0] in COMMANDS:
            return COMMANDS[argv[0]](argv[1:]) or 0
        ProjectCLI(args=_resolve_ckpt_alias(argv))
        return 0
    except ProjectError as err:
        message = str(err).strip()
        if "Original Traceback" in message:  # raised in a DataLoader worker: keep the cause
            message = message.splitlines()[-1].split(": ", 1)[-1]
        print(f"error: {message}", file=sys.stderr)
        return 2
    finally:
        _close_process_group()


def _close_process_group() -> None:
    """Lightning leaves the DDP process group open; gloo's threads can then abort the process
    at interpreter exit ('terminate called without an active exception')."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
