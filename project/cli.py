"""Command line: LightningCLI for fit/validate/test; the project's own commands, loaded only when
one runs, are in ``project/commands.py``."""

import importlib
import inspect
import logging
import sys
import warnings
from pathlib import Path

import torch
from jsonargparse import ArgumentError, Namespace
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.cli import LightningCLI, SaveConfigCallback

from project.callbacks.guards import Guards
from project.common.argv import check_renamed, expand_shorthands, pop_option
from project.common.preprocessing import plain
from project.data import FolderDataModule
from project.errors import DISK_FULL_FIX, ConfigError, ProjectError, disk_full
from project.model import ImageClassifier
from project.model.backbones import resolve_preprocessing

PREPROCESSING_KEYS = ("backbone", "weights", "input")
LIGHTNING = ("fit", "validate", "test")  # LightningCLI's subcommands here; the rest: project/commands.py

log = logging.getLogger("project")
# added, with a notice, when a config leaves them out: without them a run can go wrong silently
REQUIRED_CALLBACKS = ("project.callbacks.guards.Guards", "project.callbacks.resilience.Resilience")


class FitConfigSaver(SaveConfigCallback):
    """``config.yaml`` in the run folder, for ``fit`` only (a resume rewrites it)."""

    def setup(self, trainer, pl_module, stage: str) -> None:
        if stage == "fit":
            super().setup(trainer, pl_module, stage)


class ProjectCLI(LightningCLI):
    def __init__(self, args: list[str] | None = None, run: bool = True, tool: bool = False,
                 run_dir: str | Path | None = None) -> None:
        """``tool``: a diagnosis run (the guards only, no saved config); ``run_dir``: every logger's."""
        self.tool, self.run_dir = tool, Path(run_dir) if run_dir else None
        args = expand_shorthands(list(sys.argv[1:] if args is None else args))
        check_renamed(args)  # a config of an older version
        ckpt = pop_option(args, "--ckpt_path")[1]
        if ckpt:  # before Lightning reads its hyperparameters: one line of error for a foreign file
            from project.checkpoints import read_checkpoint

            read_checkpoint(ckpt, mmap=True)
        defaults = {"callbacks": [Guards()]} if tool else {}
        super().__init__(ImageClassifier, FolderDataModule, seed_everything_default=42,
                         save_config_callback=None if tool else FitConfigSaver,
                         save_config_kwargs={"overwrite": True}, trainer_defaults=defaults,
                         auto_configure_optimizers=False, args=args, run=run)

    def init_parser(self, **kwargs):
        """A parser that raises on a refused argument: one line from :func:`main`, not its usage."""
        parser = super().init_parser(exit_on_error=False, **kwargs)
        self.parsers = [*getattr(self, "parsers", []), parser]
        return parser

    def parse_arguments(self, parser, args) -> None:
        try:
            super().parse_arguments(parser, args)
        except ArgumentError as err:
            from project.common.arg_errors import one_line

            command = next((a for a in (sys.argv[1:] if args is None else args) if a in LIGHTNING), "fit")
            keys = [k.removeprefix(f"{command}.") for p in getattr(self, "parsers", [parser])
                    for k in p.get_defaults().keys()]  # noqa: SIM118 (its keys: nested, dotted)
            raise ConfigError(one_line(str(err), keys, command)) from None
        sub = self.config.get("subcommand")
        # what the config and command line ask of the model, before Lightning lays a checkpoint's
        # hyperparameters over it (checked in before_instantiate_classes)
        self.asked_model = (self.config[sub].model.clone() if sub and self.config[sub].get("ckpt_path")
                            else None)
        # only what the command line says: a config file may hold the run's values, or another run's
        self.given_model = {a[2:].split("=", 1)[0].removeprefix("model.")
                            for a in (sys.argv[1:] if args is None else args) if a.startswith("--model.")}

    def add_arguments_to_parser(self, parser) -> None:
        # The data decides the classes; the model keeps them for export and predict.
        parser.link_arguments("data.num_classes", "model.num_classes", apply_on="instantiate")
        parser.link_arguments("data.class_names", "model.class_names", apply_on="instantiate")
        parser.link_arguments("data.task", "model.task", apply_on="instantiate")  # project/tasks/
        parser.link_arguments("data.label_stats", "model.label_stats", apply_on="instantiate")
        parser.link_arguments("data.extra_val_names", "model.extra_val", apply_on="instantiate")
        parser.link_arguments("data.unlabeled_objective", "model.unlabeled", apply_on="instantiate")
        parser.link_arguments("data.batch_size", "model.loader_batch_size")  # the LR's batch scaling
        # the input size and normalisation, resolved once from the model's settings, for the data
        parser.link_arguments(tuple(f"model.{k}" for k in PREPROCESSING_KEYS), "data.preprocessing",
                              compute_fn=linked_preprocessing)

    @staticmethod
    def subcommands() -> dict[str, set[str]]:  # no predict: `python -m project predict` is ours
        return {k: v for k, v in LightningCLI.subcommands().items() if k in LIGHTNING}

    def before_instantiate_classes(self) -> None:
        config = self.config[self.subcommand] if self.subcommand else self.config
        seed = config.get("seed_everything")
        if config.data.get("seed") is None and isinstance(seed, int) and not isinstance(seed, bool):
            config.data.seed = config.seed_everything  # the training draw follows the run's seed
        check_optimizer_lr(config.model)
        if getattr(self, "asked_model", None) is not None:
            from project.checkpoints import refuse_model_changes

            refuse_model_changes(self.asked_model, config.model, config.ckpt_path, self.given_model)
        if config.get("ckpt_path"):  # resume, validate, test, evaluate: on the split it was trained on
            from project.checkpoints import refuse_split_changes

            refuse_split_changes(config.data, config.ckpt_path)
        trainer = config.trainer
        on_gpu = torch.cuda.is_available() and "cpu" not in str(trainer.get("accelerator") or "auto")
        if not on_gpu and str(trainer.get("precision")) in ("16-mixed", "16") and not cpu_has_bfloat16():
            log.info("Notice: trainer.precision=%s becomes 32-true: emulated bf16 runs ~6x slower than "
                     "float32 on a CPU without AVX-512 BF16 or AMX (bf16-mixed insists)", trainer.precision)
            trainer.precision = "32-true"
        if trainer.get("sync_batchnorm") and not on_gpu:
            log.info("Notice: trainer.sync_batchnorm turned off: SyncBatchNorm needs GPUs")
            trainer.sync_batchnorm = False
        if self.tool:
            return
        if self.run_dir is not None or isinstance(trainer.get("logger"), list):
            from project.runs import place_loggers  # one run folder for every logger

            new_run = self.subcommand == "fit" and not config.get("ckpt_path")
            place_loggers(trainer, self.run_dir, new_run)
        callbacks = list(trainer.get("callbacks") or [])
        present = {getattr(c, "class_path", "") for c in callbacks}
        missing = [path for path in REQUIRED_CALLBACKS if path not in present]
        if missing:
            log.info("Notice: added callbacks that every training run needs but the config lacks: %s",
                     ", ".join(p.rsplit(".", 1)[1] for p in missing))
            trainer.callbacks = callbacks + [Namespace(class_path=p, init_args=Namespace()) for p in missing]

    def instantiate_classes(self) -> None:
        try:
            super().instantiate_classes()
        except ValueError as err:  # jsonargparse wraps a callback's or logger's one-line error: unwrap it
            cause = err
            while cause is not None and not isinstance(cause, ProjectError):
                cause = cause.__cause__ or cause.__context__
            raise cause or err from None
        ckpt = self.config_init[self.subcommand].get("ckpt_path") if self.subcommand else None
        if ckpt:  # a checkpoint of other classes: one line naming both lists
            from project.checkpoints import check_checkpoint_classes

            check_checkpoint_classes(Path(ckpt), self.datamodule.class_names)
        follow_task(self.model, self.trainer)
        if self.subcommand == "fit" and not self.tool:
            notice_missing_checkpoints(self.trainer, self.model.task.monitor)

    def before_fit(self) -> None:
        if self.run_dir is not None and self.trainer.is_global_zero:  # after every check passed
            from project.runs import keep_csv_rows

            keep_csv_rows(self.run_dir)


def linked_preprocessing(backbone: str, weights: str | None, given):
    """The data's preprocessing from the model's settings, as plain values; None where a setting
    is wrong, so that the model names it in one line when it is built."""
    try:
        if isinstance(given, Namespace):  # a group, or (model.input: Input | int) the class's init_args
            given = (given.init_args if "init_args" in given else given).as_dict()
        return plain(resolve_preprocessing(backbone, weights, given))
    except (ProjectError, TypeError):
        return None


def check_optimizer_lr(model: Namespace) -> None:
    """``model.optimizer.init_args.lr`` is shown but not read (each parameter group's LR comes from
    ``model.lr``): a value other than its default or ``model.lr`` is refused, not ignored."""
    optimizer = model.get("optimizer")
    if not isinstance(optimizer, Namespace) or not isinstance(optimizer.get("init_args"), Namespace):
        return
    given = optimizer.init_args.get("lr")
    try:
        cls = getattr(importlib.import_module(optimizer.class_path.rpartition(".")[0]),
                      optimizer.class_path.rpartition(".")[2])
        default = inspect.signature(cls).parameters["lr"].default
    except (ImportError, AttributeError, KeyError, TypeError, ValueError):
        return  # an optimizer without an lr parameter: nothing shown to ignore
    if given is None or given == default or given == model.get("lr"):
        return
    raise ConfigError(f"model.optimizer.init_args.lr={given} is not read: every parameter group's learning "
                      f"rate comes from model.lr (now {model.get('lr')}, times head_lr_mult for the head); "
                      f"set model.lr={given} instead and leave model.optimizer.init_args.lr out")


def follow_task(model, trainer) -> None:
    """Checkpoints that follow the config's ``val/acc`` follow the task's own metric instead."""
    task = model.task
    for cb in trainer.checkpoint_callbacks:
        if isinstance(cb, ModelCheckpoint) and cb.monitor == "val/acc" and task.monitor != cb.monitor:
            short = task.monitor.rsplit("/", 1)[-1]
            cb.filename = (cb.filename or "").replace("acc{val/acc", f"{short}{{{task.monitor}")
            cb.monitor, cb.mode = task.monitor, task.mode
            cb.kth_value = torch.tensor(float("inf") if task.mode == "min" else float("-inf"))
    if trainer.is_global_zero:
        log.info("%s", task.describe())


def notice_missing_checkpoints(trainer, monitor: str) -> None:
    """A config whose ``trainer.callbacks:`` replaced train.yaml's list (``callbacks+:`` adds to
    it) leaves no best checkpoint nor last.ckpt, which evaluate, export and resume look for."""
    kept = {"best": any(getattr(cb, "monitor", None) for cb in trainer.checkpoint_callbacks),
            "last.ckpt": any(getattr(cb, "save_last", None) or getattr(cb, "filename", None) == "last"
                         for cb in trainer.checkpoint_callbacks)}
    missing = [name for name, there in kept.items() if not there]
    if trainer.checkpoint_callbacks and missing and trainer.is_global_zero:
        log.info("Notice: no checkpoint callback writes the %s checkpoint (evaluate, predict and export take "
                 "the best by %s, resume last.ckpt): configs/train.yaml's trainer.callbacks has them, and a "
                 "config's `callbacks:` replaces that list (write `callbacks+:` to add to it)",
                 " or ".join(missing), monitor)


def cpu_has_bfloat16() -> bool:
    """Whether this CPU computes bfloat16 natively (outside Linux: trust Lightning's choice)."""
    try:
        flags = set(Path("/proc/cpuinfo").read_text().split())
    except OSError:
        return True
    return bool(flags & {"avx512_bf16", "amx_bf16", "bf16"})


def setup_logging() -> None:
    """One-line messages on stderr, without Lightning's warnings that are not the user's."""
    warnings.filterwarnings("ignore", message="LightningCLI's args parameter")
    warnings.filterwarnings("ignore", message=".*isinstance\\(treespec, LeafSpec\\)")
    logging.getLogger("lightning.pytorch.utilities.rank_zero").addFilter(
        lambda record: "Tip: For seamless cloud logging" not in record.getMessage())
    handler = logging.StreamHandler()  # this stderr: main() may run more than once in a process
    handler.setFormatter(logging.Formatter("%(message)s"))
    logging.getLogger("project").handlers = [handler]
    logging.getLogger("project").setLevel(logging.INFO)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    setup_logging()
    try:
        if not argv or argv[0] in ("-h", "--help") or argv[0][0] != "-" and argv[0] not in LIGHTNING:
            from project.commands import run  # the project's own commands, and help for all

            code = run(argv, LIGHTNING)
            if code is not None:
                return code
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
    except Exception as err:  # a full disk met by a writer of a library (TensorBoard's, a CSV's)
        full = disk_full(err)
        if full is None:
            raise
        where = f" writing {full.filename}" if full.filename else ""
        print(f"error: no space left on the disk{where}: {DISK_FULL_FIX}", file=sys.stderr)
        return 2
    finally:
        close_process_group()


def close_process_group() -> None:
    """Lightning leaves the DDP process group open; gloo's threads could abort the exit."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
