"""Command line: LightningCLI for fit/validate/test, plus the project's own commands.

    python -m project fit --config configs/train.yaml [--key=value ...] [--run_dir DIR]
    python -m project resume [RUN_DIR] [--key=value ...]
    python -m project COMMAND --help     (COMMANDS below; each is imported only when it runs)
"""

from __future__ import annotations

import argparse
import importlib
import logging
import re
import sys
import warnings
from pathlib import Path

import torch
from jsonargparse import Namespace
from lightning.pytorch.cli import LightningCLI, SaveConfigCallback

from project.data import FolderDataModule
from project.errors import ProjectError
from project.model import ImageClassifier

log = logging.getLogger("project")
# command -> "module:function"; every module but resume's is imported only when its command runs
COMMANDS = {
    "resume": "project.runs:resume",
    "evaluate": "project.extras.analysis.evaluate:main",
    "calibrate": "project.extras.analysis.calibration:main",
    "suspects": "project.extras.analysis.suspects:main",
    "predict": "project.extras.deploy.predict:main",
    "export": "project.extras.deploy.export:main",
    "check-data": "project.extras.datatools.check_data:main",
    "resize-data": "project.extras.datatools.resize:main",
    "optimize-data": "project.extras.streaming.optimize:main",
    "overfit": "project.extras.diagnose.tools:overfit",
    "lr-find": "project.extras.diagnose.tools:lr_find",
    "find-batch-size": "project.extras.diagnose.tools:find_batch_size",
    "models": "project.extras.zoo:main",
    "sweep": "project.extras.sweep.command:main",
}
HALF_PRECISIONS = ("16-mixed", "bf16-mixed", "16", "bf16", "16-true", "bf16-true")
# added, with a notice, when a config leaves them out: without them a run can go wrong silently
REQUIRED_CALLBACKS = ("project.callbacks.guards.Guards", "project.callbacks.resilience.Resilience")


class FitConfigSaver(SaveConfigCallback):
    """Save ``config.yaml`` into the run folder for ``fit`` only (a resume rewrites it)."""

    def setup(self, trainer, pl_module, stage: str) -> None:
        if stage == "fit":
            super().setup(trainer, pl_module, stage)


class ProjectCLI(LightningCLI):
    def __init__(self, args: list[str] | None = None, run: bool = True, tool: bool = False,
                 run_dir: str | Path | None = None) -> None:
        """``tool``: a diagnosis run (overfit, LR finder): the guards only, no saved config.
        ``run_dir``: the folder every logger (and so the checkpoints) writes to."""
        self.tool, self.run_dir = tool, Path(run_dir) if run_dir else None
        defaults = {}
        if tool:
            from project.callbacks.guards import Guards

            defaults = {"callbacks": [Guards()]}
        super().__init__(ImageClassifier, FolderDataModule, seed_everything_default=42,
                         save_config_callback=None if tool else FitConfigSaver,
                         save_config_kwargs={"overwrite": True}, trainer_defaults=defaults,
                         auto_configure_optimizers=False, args=args, run=run)

    def add_arguments_to_parser(self, parser) -> None:
        # The data decides the classes; the model keeps them for export and predict.
        parser.link_arguments("data.num_classes", "model.num_classes", apply_on="instantiate")
        parser.link_arguments("data.class_names", "model.class_names", apply_on="instantiate")

    @staticmethod
    def subcommands() -> dict[str, set[str]]:
        """fit, validate, test: ``python -m project predict`` is the project's own command."""
        return {k: v for k, v in LightningCLI.subcommands().items() if k != "predict"}

    def before_instantiate_classes(self) -> None:
        config = self.config[self.subcommand] if self.subcommand else self.config
        seed = config.get("seed_everything")
        if config.data.get("seed") is None and isinstance(seed, int) and not isinstance(seed, bool):
            config.data.seed = config.seed_everything  # the training draw follows the run's seed
        trainer = config.trainer
        on_gpu = torch.cuda.is_available() and "cpu" not in str(trainer.get("accelerator") or "auto")
        if not on_gpu and str(trainer.get("precision")) in HALF_PRECISIONS and not cpu_has_bfloat16():
            log.info("Notice: trainer.precision=%s becomes 32-true: this CPU has no bfloat16 "
                     "instructions (AVX-512 BF16 or AMX), where bf16 runs ~10x slower than float32",
                     trainer.precision)
            trainer.precision = "32-true"
        if trainer.get("sync_batchnorm") and not on_gpu:
            log.info("Notice: trainer.sync_batchnorm turned off: SyncBatchNorm needs GPUs, and this "
                     "run is on the CPU (each process keeps its own BatchNorm statistics).")
            trainer.sync_batchnorm = False
        if self.tool:
            return
        if self.run_dir is not None or isinstance(trainer.get("logger"), list):
            from project.runs import place_loggers  # one run folder for every logger

            place_loggers(trainer, self.run_dir)
        callbacks = list(trainer.get("callbacks") or [])
        present = {getattr(c, "class_path", "") for c in callbacks}
        missing = [path for path in REQUIRED_CALLBACKS if path not in present]
        if missing:
            log.info("Notice: added callbacks that every training run needs but the config lacks: %s",
                     ", ".join(p.rsplit(".", 1)[1] for p in missing))
            trainer.callbacks = callbacks + [Namespace(class_path=p, init_args=Namespace()) for p in missing]

    def _check_checkpoint(self, subcommand: str) -> None:
        ckpt = self.config_init[subcommand].get("ckpt_path")
        if ckpt:
            from project.checkpoints import check_checkpoint_classes

            check_checkpoint_classes(Path(ckpt), self.datamodule.class_names)

    def before_fit(self) -> None:
        self._check_checkpoint("fit")

    def before_validate(self) -> None:
        self._check_checkpoint("validate")

    def before_test(self) -> None:
        self._check_checkpoint("test")


def cpu_has_bfloat16() -> bool:
    """Whether this CPU computes bfloat16 natively. x86 CPUs without AVX-512 BF16 or AMX emulate
    it (bf16 autocast ran 10x slower than float32 on an AVX2 machine). Outside Linux it cannot
    tell and trusts Lightning's choice."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return True
    flags = set(re.findall(r"[\w.]+", " ".join(line for line in text.splitlines()
                                                 if line.startswith(("flags", "Features")))))
    return bool(flags & {"avx512_bf16", "amx_bf16", "bf16"})


def pop_option(argv: list[str], name: str) -> tuple[list[str], str | None]:
    """``argv`` without ``name VALUE`` / ``name=VALUE``, and that value."""
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    parser.add_argument(name)
    found, rest = parser.parse_known_args(argv)
    return rest, getattr(found, name.lstrip("-"))


def setup_logging() -> None:
    # main() passes its arguments on explicitly (after resolving aliases): not a mistake.
    warnings.filterwarnings("ignore", message="LightningCLI's args parameter")
    # raised inside Lightning with this torch version; nothing a user can act on
    warnings.filterwarnings("ignore", message=".*isinstance\\(treespec, LeafSpec\\)")
    # Lightning 2.6 advertises a cloud service on every run; it is not about this run
    logging.getLogger("lightning.pytorch.utilities.rank_zero").addFilter(
        lambda record: "Tip: For seamless cloud logging" not in record.getMessage())
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
            module, function = COMMANDS[argv[0]].split(":")
            return getattr(importlib.import_module(module), function)(argv[1:]) or 0
        argv, run_dir = pop_option(argv, "--run_dir")
        if argv and argv[0] in ("validate", "test"):
            from project.runs import resolve_ckpt_alias  # --ckpt_path best|last

            argv = resolve_ckpt_alias(argv)
        ProjectCLI(args=argv, run_dir=run_dir)
        return 0
    except ProjectError as err:
        message = str(err).strip()
        if "Original Traceback" in message:  # raised in a DataLoader worker: keep the cause
            message = message.splitlines()[-1].split(": ", 1)[-1]
        print(f"error: {message}", file=sys.stderr)
        return 2
    finally:
        close_process_group()


def close_process_group() -> None:
    """Lightning leaves the DDP process group open; gloo's threads can then abort the process
    at interpreter exit ('terminate called without an active exception')."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
