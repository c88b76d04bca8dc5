"""Every setting reaches the code that uses it (fast, in-process, no config parser, no training).

For each key that ``fit --print_config`` shows under ``model.`` and ``data.`` (``KINDS`` of
test_fuzz.py) a non-default valid value must change what its consumer BUILDS or COMPUTES, not the
stored hyperparameters: the network's parameters (shapes, layout, seeded values), the parameter
groups, the optimizer and its LR schedule over a known run length, the loss of two seeded training
steps and the updated weights, the outputs and answers on a fixed batch, the transforms applied to a
fixed image under fixed seeds, the splits, the decode side and cache, the DataLoaders' settings and
their epoch-0 draw.

The model and the data module are built directly with keyword arguments, with the CLI's links done
here as ``project/cli.py`` does them: ``data.preprocessing`` by the CLI's own
``linked_preprocessing`` from the model's settings; ``model.num_classes/class_names/task/
label_stats/extra_val/unlabeled`` from the built data module; ``model.loader_batch_size`` from
``data.batch_size``; ``data.seed`` from ``seed_everything`` (42). The optimizer and scheduler are
the partials jsonargparse makes (class + init_args). A key whose effect needs another setting
first (``model.head.hidden`` needs ``model.head.kind=mlp``) is compared within that context.

A key must be in CHANGES (checked), NOTHING_TO_SEE (its effect cannot be seen in-process on a CPU)
or KNOWN_GAPS (it changes nothing, or has no valid non-default value, though it should: a bug).
A new key fails until someone decides which.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import inspect
import itertools
import shutil
from dataclasses import dataclass, field

import pytest
import torch
from lightning import Trainer

from project.cli import linked_preprocessing
from project.data import FolderDataModule
from project.data.transforms import Augmentation
from project.data.unlabeled import Unlabeled
from project.errors import ProjectError
from project.model import ImageClassifier
from project.model.schedule import DeferredScheduler
from project.tasks.answers import answers
from tests.conftest import CLASSES
from tests.test_fuzz import KINDS

OWN_NET = "tests.own_backbone:tiny_net"  # the backbone wherever the backbone is not under test
LENGTHS = {"total_steps": 40, "steps_per_epoch": 4, "epochs": 10}  # the run the schedule is built for

# The printed defaults (`fit --config configs/train.yaml --print_config`), except: a small own
# network from its own initialisation at 32 px, the tiny data in batches of 8, and data.seed as
# the CLI sets it from seed_everything (42) when null.
DEFAULTS = {
    "model.loss": None, "model.backbone": OWN_NET, "model.weights": None,
    "model.head.kind": "linear", "model.head.hidden": 512, "model.head.dropout": 0.0,
    "model.input.size": 32, "model.input.crop_ratio": None, "model.input.interpolation": None,
    "model.input.mean": None, "model.input.std": None,
    "model.optimizer.class_path": "torch.optim.SGD",
    "model.optimizer.init_args.lr": 0.001, "model.optimizer.init_args.momentum": 0.9,
    "model.optimizer.init_args.dampening": 0.0, "model.optimizer.init_args.weight_decay": 1e-4,
    "model.optimizer.init_args.nesterov": False, "model.optimizer.init_args.maximize": False,
    "model.optimizer.init_args.foreach": None, "model.optimizer.init_args.differentiable": False,
    "model.optimizer.init_args.fused": None,
    "model.scheduler.class_path": "project.model.schedule.WarmupCosine",
    "model.scheduler.init_args.warmup_epochs": 3.0, "model.scheduler.init_args.warmup_start_factor": 0.01,
    "model.scheduler.init_args.end_factor": 0.0, "model.scheduler.init_args.max_warmup_share": 0.2,
    "model.scheduler.init_args.cosine_interval": "step", "model.scheduler.init_args.total_steps": None,
    "model.scheduler.init_args.steps_per_epoch": None, "model.scheduler.init_args.last_epoch": -1,
    "model.lr": 0.01, "model.head_lr_mult": 10.0, "model.layer_decay": None, "model.lr_scaling": "none",
    "model.base_batch_size": 64, "model.label_smoothing": 0.0, "model.mixup_alpha": 0.0,
    "model.cutmix_alpha": 0.0, "model.class_weights": None, "model.channels_last": True,
    "model.compile": False, "model.min_confidence": None,
    "data.data_dir": "{tiny}", "data.labels": None, "data.task": "auto", "data.batch_size": 8,
    "data.num_workers": None, "data.pin_memory": None, "data.persistent_workers": True,
    "data.prefetch_factor": None,
    "data.augmentation.hflip": 0.5, "data.augmentation.vflip": 0.0,
    "data.augmentation.crop_scale": (0.6, 1.0), "data.augmentation.color_jitter": 0.2,
    "data.augmentation.auto_augment": "none", "data.augmentation.random_erasing": 0.0,
    "data.val_fraction": 0.15, "data.test_fraction": 0.15, "data.split_seed": 0, "data.seed": 42,
    "data.balanced_sampling": False, "data.cache": "auto", "data.cache_gb": 2.0,
    "data.decode_side": "auto", "data.on_bad_image": "skip", "data.extra_val": None,
    "data.unlabeled.images": None, "data.unlabeled.method": "fixmatch", "data.unlabeled.ratio": 7,
    "data.unlabeled.threshold": 0.95, "data.unlabeled.weight": 1.0,
}


@dataclass(frozen=True)
class Change:
    """A non-default valid ``value``; ``shows_in``: the parts of the fingerprint (see
    :func:`fingerprint`) where its consumer's work must differ; ``context``: other settings it
    needs to have an effect (the baseline has them too)."""

    value: object
    shows_in: tuple[str, ...]
    context: dict = field(default_factory=dict)


FLAT = {"data.data_dir": "{flat}"}  # one folder of class folders: the fractions and split_seed split it
MLP = {"model.head.kind": "mlp"}
PRETRAINED = {"model.weights": "{weights}"}  # a weights file: the head's LR multiplier applies
WORKERS = {"data.num_workers": 2}
TABLE = {"data.labels": "{table}"}
UNLABELED = {"data.unlabeled.images": "{unlabeled}", "data.unlabeled.ratio": 1}
TRAIN_ITEMS = ("items", "train_batch", "steps")  # what a training image's change shows in
EVAL_ITEMS = ("items", "eval")

CHANGES: dict[str, Change] = {
    "model.loss": Change("focal", ("train_loss", "eval")),
    "model.backbone": Change("resnet18", ("params",)),
    "model.weights": Change("{weights}", ("params", "groups")),
    "model.head.kind": Change("mlp", ("params",)),
    "model.head.hidden": Change(16, ("params",), MLP),
    "model.head.dropout": Change(0.5, ("train_loss",), MLP),
    "model.input.size": Change(24, ("transforms", *TRAIN_ITEMS, *EVAL_ITEMS)),
    "model.input.crop_ratio": Change(0.5, ("transforms", *EVAL_ITEMS)),
    "model.input.interpolation": Change("bicubic", ("transforms", *EVAL_ITEMS)),
    "model.input.mean": Change([0.5, 0.5, 0.5], ("transforms", *TRAIN_ITEMS, *EVAL_ITEMS)),
    "model.input.std": Change([0.5, 0.5, 0.5], ("transforms", *TRAIN_ITEMS, *EVAL_ITEMS)),
    "model.optimizer.class_path": Change("torch.optim.AdamW", ("optimizer", "steps")),
    "model.optimizer.init_args.momentum": Change(0.5, ("optimizer", "steps")),
    "model.optimizer.init_args.dampening": Change(0.5, ("optimizer", "steps")),
    "model.optimizer.init_args.weight_decay": Change(0.1, ("optimizer", "steps")),
    "model.optimizer.init_args.nesterov": Change(True, ("optimizer", "steps")),
    "model.optimizer.init_args.maximize": Change(True, ("optimizer", "steps")),
    # implementation choices: the same numbers; torch's optimizer holds (and dispatches on) them
    "model.optimizer.init_args.foreach": Change(False, ("optimizer",)),
    "model.optimizer.init_args.fused": Change(True, ("optimizer",)),
    "model.scheduler.class_path": Change("torch.optim.lr_scheduler.ConstantLR", ("lrs", "steps")),
    "model.scheduler.init_args.warmup_epochs": Change(1.0, ("lrs",)),
    "model.scheduler.init_args.warmup_start_factor": Change(0.5, ("lrs", "steps")),
    "model.scheduler.init_args.end_factor": Change(0.1, ("lrs",)),
    "model.scheduler.init_args.max_warmup_share": Change(0.5, ("lrs",)),
    "model.scheduler.init_args.cosine_interval": Change("epoch", ("lrs",)),
    "model.scheduler.init_args.total_steps": Change(20, ("lrs",)),
    "model.scheduler.init_args.steps_per_epoch": Change(2, ("lrs",)),
    "model.lr": Change(0.05, ("groups", "lrs", "steps")),
    "model.head_lr_mult": Change(3.0, ("groups", "lrs", "steps"), PRETRAINED),
    "model.layer_decay": Change(0.5, ("groups", "lrs", "steps")),
    "model.lr_scaling": Change("linear", ("groups", "lrs", "steps")),
    "model.base_batch_size": Change(16, ("groups", "lrs", "steps"), {"model.lr_scaling": "sqrt"}),
    "model.label_smoothing": Change(0.2, ("train_loss", "eval")),
    "model.mixup_alpha": Change(0.4, ("train_loss",)),
    "model.cutmix_alpha": Change(1.0, ("train_loss",)),
    "model.class_weights": Change([1.0, 2.0, 3.0, 4.0, 5.0], ("train_loss", "eval")),
    "model.channels_last": Change(False, ("params",)),
    "model.min_confidence": Change(0.9, ("answers",)),
    "data.data_dir": Change("{flat}", ("splits",)),
    "data.labels": Change("{table}", ("splits",)),
    "data.task": Change("multilabel", ("classes", "splits", "metrics", "train_loss"), TABLE),
    "data.batch_size": Change(4, ("loaders", "train_batch")),
    "data.num_workers": Change(2, ("loaders",)),
    "data.pin_memory": Change(True, ("loaders",)),
    "data.persistent_workers": Change(False, ("loaders",), WORKERS),
    "data.prefetch_factor": Change(4, ("loaders",), WORKERS),
    "data.augmentation.hflip": Change(0.0, ("transforms", *TRAIN_ITEMS)),
    "data.augmentation.vflip": Change(1.0, ("transforms", *TRAIN_ITEMS)),
    "data.augmentation.crop_scale": Change((0.2, 0.5), ("transforms", "decode", *TRAIN_ITEMS)),
    "data.augmentation.color_jitter": Change(0.0, ("transforms", *TRAIN_ITEMS)),
    "data.augmentation.auto_augment": Change("randaugment", ("transforms", *TRAIN_ITEMS)),
    "data.augmentation.random_erasing": Change(1.0, ("transforms", *TRAIN_ITEMS)),
    "data.val_fraction": Change(0.3, ("splits",), FLAT),
    "data.test_fraction": Change(0.3, ("splits",), FLAT),
    "data.split_seed": Change(1, ("splits",), FLAT),
    "data.seed": Change(7, ("loaders", "train_batch")),
    "data.balanced_sampling": Change(True, ("loaders",)),
    "data.cache": Change("none", ("decode",)),
    "data.cache_gb": Change(1e-6, ("decode",)),  # below what the tiny splits need: auto does not cache
    "data.decode_side": Change(100, ("decode",)),
    "data.on_bad_image": Change("error", ("items",), {"data.data_dir": "{bad}"}),
    "data.extra_val": Change({"again": "{extra}"}, ("loaders", "metrics")),
    "data.unlabeled.images": Change("{unlabeled}", ("loaders", "items", "train_loss")),
    "data.unlabeled.ratio": Change(3, ("loaders", "train_batch"), {"data.unlabeled.images": "{unlabeled}"}),
    "data.unlabeled.threshold": Change(0.1, ("train_loss",), UNLABELED),
    # the baseline's threshold accepts no pseudo-label (an untrained net is never 95 % sure)
    "data.unlabeled.weight": Change(0.5, ("train_loss",), {**UNLABELED, "data.unlabeled.threshold": 0.1}),
}

# key -> why its effect cannot be seen in-process on a CPU (or there is no other valid value)
NOTHING_TO_SEE = {
    "model.optimizer.init_args.lr": "model.lr sets every parameter group's LR; the CLI refuses another "
                                    "value in one line naming model.lr (cli.check_optimizer_lr)",
    "model.optimizer.init_args.differentiable": "no valid non-default value: true is refused in one line "
                                                "(schedule.check_factories takes a step on a stand-in)",
    "model.scheduler.init_args.last_epoch": "no valid non-default value for a new run: another is refused "
                                            "in one line (schedule.check_factories)",
    "model.compile": "torch.compile happens at the first forward: tens of seconds of inductor (and a "
                     "C++ toolchain) on a CPU; before it, only a private attribute "
                     "(nn.Module._compiled_call_impl) shows it",
    "data.unlabeled.method": "no other valid value: fixmatch is the only objective "
                             "(project/model/unlabeled.py OBJECTIVES); any other is refused",
}

# key -> what is wrong: printed, accepted keys that change nothing (or have no valid non-default
# value). Each is still tried: when one starts to reach its consumer this test says to move it.
KNOWN_GAPS: dict[str, str] = {}  # none left: each found one is fixed, or refused in one line below


# -- building, as the CLI does -------------------------------------------------------------------
@pytest.fixture(scope="module")
def where(tiny_data, tmp_path_factory) -> dict[str, str]:
    """The paths the settings name: the tiny data as one folder, a labels table, a copy with an
    undecodable image (the validation split's last: not in the fixed evaluation batch), a weights file, extra
    and unlabeled images."""
    out = tmp_path_factory.mktemp("reach")
    images = [p for split in ("train", "val") for p in sorted((tiny_data / split).rglob("*.png"))]
    rows = ["image,label"] + [f"{p.relative_to(tiny_data).as_posix()},{p.parent.name}" for p in images]
    (out / "labels.csv").write_text("\n".join(rows) + "\n")
    bad = out / "bad"
    shutil.copytree(tiny_data, bad)
    (bad / "val" / CLASSES[-1] / "zzz_broken.png").write_bytes(b"\x89PNG\r\n\x1a\n not an image")
    from tests.own_backbone import tiny_net

    torch.manual_seed(123)
    torch.save(tiny_net().state_dict(), out / "tiny.pth")
    return {"tiny": str(tiny_data), "flat": str(tiny_data / "train"), "table": str(out / "labels.csv"),
            "bad": str(bad), "weights": str(out / "tiny.pth"), "extra": str(tiny_data / "test"),
            "unlabeled": str(shutil.copytree(tiny_data / "test", out / "unlabeled"))}  # not the data's own


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny tensors: one thread is faster than several, and leaves the other cores alone."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def trainer() -> Trainer:
    """What configure_optimizers reads of a trainer (one CPU device, no accumulation)."""
    return Trainer(accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                   enable_progress_bar=False, enable_model_summary=False, max_epochs=10)


def filled(value, where: dict[str, str]):
    if isinstance(value, str) and value.startswith("{"):
        return value.format(**where)
    if isinstance(value, dict):
        return {k: filled(v, where) for k, v in value.items()}
    return value


def group(settings: dict, prefix: str) -> dict:
    return {k.removeprefix(prefix): v for k, v in settings.items() if k.startswith(prefix)}


def class_callable(settings: dict, name: str):
    """``model.optimizer``/``model.scheduler`` as jsonargparse gives it: the class with its
    init_args (those the class takes: a new class_path keeps the values that still apply)."""
    module, _, cls = settings[f"{name}.class_path"].rpartition(".")
    cls = getattr(importlib.import_module(module), cls)
    takes = inspect.signature(cls).parameters
    init = {k: v for k, v in group(settings, f"{name}.init_args.").items() if k in takes}
    return functools.partial(cls, **init)


def build(settings: dict, where: dict[str, str],
          trainer: Trainer) -> tuple[ImageClassifier, FolderDataModule]:
    s = {k: filled(v, where) for k, v in settings.items()}
    m, d = group(s, "model."), group(s, "data.")
    model_input = group(m, "input.")
    dm = FolderDataModule(
        **{k: v for k, v in d.items() if "." not in k},
        augmentation=Augmentation(**group(d, "augmentation.")),
        unlabeled=Unlabeled(**group(d, "unlabeled.")),
        preprocessing=linked_preprocessing(m["backbone"], m["weights"], model_input))  # the CLI's link
    torch.manual_seed(0)  # the CLI's seed_everything, before the model is built
    model = ImageClassifier(
        **{k: v for k, v in m.items() if "." not in k},
        head=group(m, "head."), input=model_input,
        optimizer=class_callable(m, "optimizer"), scheduler=class_callable(m, "scheduler"),
        # the CLI's links from the data (apply_on="instantiate") and data.batch_size
        num_classes=dm.num_classes, class_names=dm.class_names, task=dm.task, label_stats=dm.label_stats,
        extra_val=dm.extra_val_names, unlabeled=dm.unlabeled_objective, loader_batch_size=d["batch_size"])
    model.trainer = trainer
    model.log = lambda *args, **kwargs: None  # training_step logs; no loop is running
    dm.setup("fit")
    dm.setup("test")
    model.setup("fit")
    return model, dm


# -- the fingerprint ------------------------------------------------------------------------------
def digest(value) -> object:
    """Tensors (nested in tuples, lists, dicts) as shape and a hash of their values."""
    if isinstance(value, torch.Tensor):
        t = value.detach().cpu().contiguous()
        return (tuple(t.shape), str(t.dtype), hashlib.sha1(t.numpy().tobytes()).hexdigest()[:16])
    if isinstance(value, list | tuple):
        return tuple(digest(v) for v in value)
    if isinstance(value, dict):
        return tuple((k, digest(v)) for k, v in value.items())
    return value


def item(dataset, key) -> object:
    try:
        return digest(dataset[key])
    except Exception as err:  # noqa: BLE001  (on_bad_image=error: the failure is the fingerprint)
        return type(err).__name__


def loader_settings(loader) -> tuple:
    sampler = loader.sampler
    return (loader.batch_size, loader.num_workers, loader.pin_memory, loader.persistent_workers,
            loader.prefetch_factor, type(sampler).__name__, tuple(iter(sampler)), len(loader.dataset),
            loader.generator.initial_seed() if loader.generator is not None else None)


def first_batch(loader, in_order: bool = False):
    """The loader's first batch, drawn in this process (no workers started); ``in_order``: the
    dataset's first items instead of the sampler's."""
    keys = range(min(loader.batch_size, len(loader.dataset))) if in_order else \
        list(itertools.islice(iter(loader.sampler), loader.batch_size))
    return loader.collate_fn([loader.dataset[k] for k in keys])


NOISE = torch.randint(0, 256, (3, 40, 48), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))


def fingerprint(settings: dict, where: dict[str, str], trainer: Trainer) -> dict[str, object]:
    """What the model and the data module build and compute, part by part."""
    from project.data.datasets import seeded_transform

    model, dm = build(settings, where, trainer)
    fp: dict[str, object] = {}
    # -- data
    fp["classes"] = (dm.class_names, dm.task, digest(dm.label_stats))
    fp["splits"] = tuple((name, tuple((s.path, s.label) for s in ds.samples))
                         for name, ds in sorted(dm.datasets.items()))
    fp["decode"] = tuple((name, ds.short_side,
                          None if ds.cache is None else (ds.cache.short_side, len(ds.cache)))
                         for name, ds in sorted(dm.datasets.items()))
    fp["transforms"] = tuple(digest(seeded_transform(dm.transform(split), NOISE, seed))
                             for split in ("train", "val") for seed in (0, 1, 2, 3))
    fp["items"] = tuple((name, tuple(item(ds, (i, seed) if name in ("train", "unlabeled") else i)
                                     for i in (0, len(ds) - 1) for seed in (0, 1)))
                        for name, ds in sorted(dm.datasets.items()))
    train = dm.train_dataloader()
    vals = dm.val_dataloader()
    vals = vals if isinstance(vals, list) else [vals]
    loaders = train if isinstance(train, dict) else {"train": train}
    fp["loaders"] = (tuple((k, loader_settings(v)) for k, v in loaders.items()),
                     tuple(loader_settings(v) for v in vals), loader_settings(dm.test_dataloader()))
    batch = {k: first_batch(v) for k, v in train.items()} if isinstance(train, dict) else first_batch(train)
    fp["train_batch"] = digest(batch)
    # -- model
    fp["params"] = tuple((n, tuple(p.shape), p.stride(), digest(p)) for n, p in model.named_parameters())
    fp["metrics"] = (model.task.name, tuple(model.extra_val_metrics))
    configured = model.configure_optimizers()
    opt, scheduler = (configured["optimizer"], configured["lr_scheduler"]["scheduler"]) \
        if isinstance(configured, dict) else (configured, None)
    fp["groups"] = tuple((g.get("name"), g["lr"], g["weight_decay"], len(g["params"]))
                         for g in opt.param_groups)
    fp["optimizer"] = (type(opt).__name__, tuple(
        tuple(sorted((k, repr(v)) for k, v in g.items() if k != "params")) for g in opt.param_groups))
    # -- the evaluation of a fixed batch with the weights as built
    model.eval()
    x, y = first_batch(vals[0], in_order=True)
    with torch.no_grad():
        logits = model(x)
        fp["eval"] = (digest(logits), model.loss(logits, y).item())
    rows = answers(model.class_names, model.answer_state()).rows(
        [str(i) for i in range(len(x))], logits.numpy(), top_k=2)
    fp["answers"] = tuple(tuple(sorted(r.items())) for r in rows)
    # -- the schedule over a known run, and two training steps on the first batch
    if isinstance(scheduler, DeferredScheduler):
        scheduler.build(LENGTHS)
    lrs, losses = [], []
    model.train()
    for step in range(LENGTHS["total_steps"]):
        lrs.append(tuple(g["lr"] for g in opt.param_groups))
        if step < 2:  # two real steps: the loss, the gradients and the update
            torch.manual_seed(step)
            opt.zero_grad()
            loss = model.training_step(batch, step)
            loss.backward()
            opt.step()
            losses.append(loss.item())
        if scheduler is not None:
            scheduler.step()
    fp["lrs"] = tuple(lrs)
    fp["train_loss"] = tuple(losses)
    fp["steps"] = tuple((n, digest(p)) for n, p in model.named_parameters())
    return fp


BASELINES: dict[tuple, dict] = {}


def baseline(context: dict, where: dict[str, str], trainer: Trainer) -> dict[str, object]:
    key = (tuple(sorted(where.items())), tuple(sorted((k, repr(v)) for k, v in context.items())))
    if key not in BASELINES:
        BASELINES[key] = fingerprint({**DEFAULTS, **context}, where, trainer)
    return BASELINES[key]


def test_every_key_is_checked_or_listed():
    """A key the config grows fails here until someone decides: CHANGES, NOTHING_TO_SEE or KNOWN_GAPS."""
    assert set(DEFAULTS) == set(KINDS), (f"DEFAULTS lacks {sorted(set(KINDS) - set(DEFAULTS))}, "
                                         f"has unknown {sorted(set(DEFAULTS) - set(KINDS))}")
    undecided = sorted(set(KINDS) - set(CHANGES) - set(NOTHING_TO_SEE))
    assert not undecided, f"settings nobody has checked or listed: {undecided}"
    assert not set(NOTHING_TO_SEE) & set(CHANGES), "a key both checked and listed as unobservable"
    assert set(KNOWN_GAPS) <= set(CHANGES), "a known gap without a value to try"
    assert not set(CHANGES) - set(KINDS) and not set(NOTHING_TO_SEE) - set(KINDS), "keys KINDS lacks"


@pytest.mark.parametrize("key", sorted(KINDS))
def test_every_setting_changes_what_its_consumer_builds_or_computes(key, where, trainer):
    if key in NOTHING_TO_SEE:
        pytest.skip(f"nothing to see in-process on a CPU: {NOTHING_TO_SEE[key]}")
    assert key in CHANGES, f"{key}: add it to CHANGES, NOTHING_TO_SEE or KNOWN_GAPS"
    change = CHANGES[key]
    assert DEFAULTS[key] != change.value and change.context.get(key, DEFAULTS[key]) != change.value
    base = baseline(change.context, where, trainer)
    try:
        changed = fingerprint({**DEFAULTS, **change.context, key: change.value}, where, trainer)
    except Exception as err:
        if key in KNOWN_GAPS:
            assert not isinstance(err, ProjectError), (
                f"{key}={change.value!r} is now refused in one line ({err}): if no other value is valid, "
                f"move it from KNOWN_GAPS to NOTHING_TO_SEE (was: {KNOWN_GAPS[key]})")
            pytest.skip(f"KNOWN GAP {key} ({type(err).__name__}): {KNOWN_GAPS[key]}")
        raise
    differs = [part for part in base if changed[part] != base[part]]
    if key in KNOWN_GAPS:
        assert not differs, (f"{key}={change.value!r} now changes {differs}: remove it from KNOWN_GAPS "
                             f"(was: {KNOWN_GAPS[key]})")
        pytest.skip(f"KNOWN GAP {key}: {KNOWN_GAPS[key]}")
    missing = [part for part in change.shows_in if part not in differs]
    assert not missing, (f"{key}={change.value!r} (with {change.context or 'the defaults'}) does not change "
                         f"{missing}; it changes {differs or 'nothing'}")


# -- evaluation is never augmented -----------------------------------------------------------------
def eval_items(settings: dict, where: dict[str, str]) -> dict[str, tuple]:
    s = {k: filled(v, where) for k, v in settings.items()}
    m, d = group(s, "model."), group(s, "data.")
    dm = FolderDataModule(**{k: v for k, v in d.items() if "." not in k},
                          augmentation=Augmentation(**group(d, "augmentation.")),
                          unlabeled=Unlabeled(**group(d, "unlabeled.")),
                          preprocessing=linked_preprocessing(m["backbone"], m["weights"], group(m, "input.")))
    dm.setup("validate")
    dm.setup("test")
    return {split: tuple(ds[i] for i in range(len(ds)))
            for split, ds in dm.datasets.items() if split in ("val", "test")}


def test_evaluation_transforms_ignore_augmentation(where):
    default = eval_items(DEFAULTS, where)
    keys = [k for k in CHANGES if k.startswith("data.augmentation.")]
    assert len(keys) == len(Augmentation.__dataclass_fields__)
    for key in keys:
        got = eval_items({**DEFAULTS, key: CHANGES[key].value}, where)
        for split in ("val", "test"):
            for i, ((x, y), (x0, y0)) in enumerate(zip(got[split], default[split], strict=True)):
                same = y == y0 and torch.equal(x, x0)
                assert same, f"{key}={CHANGES[key].value!r} changes the {split} split's image {i}"


# -- the loss reads its settings when it is computed -----------------------------------------------
@pytest.mark.parametrize(("task", "loss"), [("multiclass", "cross_entropy"), ("multiclass", "focal"),
                                            ("multilabel", "bce"), ("multilabel", "asymmetric")])
def test_loss_settings_are_read_when_the_loss_is_computed(task, loss):
    """A callback that schedules label smoothing (as one schedules the LR) changes
    ``model.hparams.label_smoothing`` mid-run: the next loss must use it, as a model built with it
    would. Fails while the task's loss keeps the value it was built with (tasks/base.py builds
    ``criterion`` once; tasks/single.py and tasks/multilabel.py close over the value)."""
    def built(smoothing: float) -> ImageClassifier:
        torch.manual_seed(0)
        return ImageClassifier(num_classes=5, task=task, backbone=OWN_NET, weights=None, input=32, loss=loss,
                               label_smoothing=smoothing).eval()

    g = torch.Generator().manual_seed(0)
    x = torch.randn(6, 3, 32, 32, generator=g)
    y = torch.tensor([0, 1, 2, 3, 4, 0])
    if task == "multilabel":
        y = (torch.rand(6, 5, generator=g) < 0.4).float()
    model = built(0.0)
    with torch.no_grad():
        before = model.loss(model(x), y).item()
        model.hparams.label_smoothing = 0.3
        after = model.loss(model(x), y).item()
        wanted = (other := built(0.3)).loss(other(x), y).item()
    assert before != wanted, "the test's smoothing changes nothing: pick another value"
    assert after != before, (f"{task}/{loss}: model.hparams.label_smoothing set to 0.3 mid-run, the loss "
                             f"stayed {before:.6f} (a model built with 0.3: {wanted:.6f}): it keeps the "
                             "value it was built with")
    assert after == pytest.approx(wanted, rel=1e-6)


def test_mixup_and_cutmix_follow_their_settings_when_a_step_runs():
    """A callback that turns MixUp off for the last epochs (or CutMix on after a warm-up) sets
    ``model.hparams.mixup_alpha``/``cutmix_alpha``: the next training step must follow it. Fails
    while the model keeps the mixing it was built with."""
    model = ImageClassifier(num_classes=5, backbone=OWN_NET, weights=None, input=32, mixup_alpha=0.4)
    targets: list[int] = []
    model.loss = lambda logits, target: targets.append(target.dim()) or logits.sum()
    model.log = lambda *args, **kwargs: None
    batch = (torch.randn(4, 3, 32, 32), torch.tensor([0, 1, 2, 3]))
    for mixup, cutmix in ((0.4, 0.0), (0.0, 0.0), (0.0, 1.0)):
        model.hparams.mixup_alpha, model.hparams.cutmix_alpha = mixup, cutmix
        model.training_step(batch, 0)
    assert targets == [2, 1, 2], "soft (2-D) targets while mixing is on, the labels while it is off"
