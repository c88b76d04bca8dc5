"""Write a config for a data set, from the data itself.

    python -m project init DATA [--labels TABLE] [--weights DEFAULT|null|PATH] [--backbone NAME]
                                [--out configs/NAME.yaml]

Reads the data once (its layout and splits, classes and their counts, a table's task, image
sizes and channels from the files' headers, identical files) and writes configs/train.yaml's
content with the choices the data implies, each with a comment saying what in the data chose
it. ``python -m project fit --config configs/NAME.yaml`` runs it as it is; edit it freely.
"""

from __future__ import annotations

import argparse
import inspect
import re
import statistics
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from PIL import Image

from project.common.files import write_text
from project.common.preprocessing import Input
from project.data.folders import (
    DataFolderError,
    FolderSplits,
    discover,
    empty_split_fix,
    layout,
    structure_problems,
)
from project.data.images import aspect_notice
from project.data.splits import content_groups
from project.errors import ConfigError, ProjectError

REPO = Path(__file__).resolve().parents[3]
TRAIN_CONFIG = REPO / "configs" / "train.yaml"
SCRATCH_PRESET = REPO / "configs" / "presets" / "scratch.yaml"
HEADERS = 400  # image headers read: sizes and channels of an even sample of the files
IMBALANCE = 3.0  # the largest class over the smallest above which draws or the loss are balanced
SMALL = 64  # images whose median short side is at most this: evaluation sees the whole image


@dataclass
class Survey:
    """What ``init`` read of the data: enough to choose every data-derived setting."""

    data_dir: str
    labels: str | None
    splits: FolderSplits
    given_splits: list[str]  # the splits the data holds itself (folders, or the table's split column)
    short_sides: list[int] = field(default_factory=list)  # of the sampled headers
    aspects: list[float] = field(default_factory=list)  # long side over short side, of the same
    modes: Counter = field(default_factory=Counter)
    copies: int = 0

    @property
    def task(self):
        from project import tasks

        return tasks.task_class(self.splits.task)

    @property
    def counts(self) -> dict[str, int] | None:
        """Training images per class (labels: images showing it); None when the outputs are not
        classes (numbers of a regression)."""
        labels = [s.label for s in self.splits.train]
        names = self.splits.classes
        if all(isinstance(y, int) for y in labels):
            found = Counter(labels)
            return {n: found.get(i, 0) for i, n in enumerate(names)}
        if all(isinstance(y, list | tuple) and set(y) <= {0, 1} and len(y) == len(names) for y in labels):
            return {n: sum(int(y[i]) for y in labels) for i, n in enumerate(names)}
        return None

    @property
    def labels_per_image(self) -> float:
        """Classes an image shows on average (1 for class folders; more: several objects each)."""
        counts = self.counts
        return sum(counts.values()) / max(1, len(self.splits.train)) if counts else 1.0

    @property
    def median_side(self) -> int:
        return int(statistics.median(self.short_sides)) if self.short_sides else 224

    def describe(self) -> list[str]:
        """The survey in a few lines (printed, and the head of the config)."""
        s = self.splits
        where = f"{self.data_dir}" + (f" with {self.labels}" if self.labels else "")
        given = ", ".join(self.given_splits) if self.given_splits else "none (one set of images)"
        from project import tasks

        total = len(s.train) + len(s.val) + len(s.test)
        lines = [f"{where}: {total} images, task {tasks.check_name(s.task)}, splits given: {given}; "
                 f"train/val/test {len(s.train)}/{len(s.val)}/{len(s.test)}"]
        counts = self.counts
        if counts:
            shown = ", ".join(f"{n} {c}" for n, c in list(counts.items())[:12])
            lines.append(f"{len(counts)} classes, training images each: {shown}"
                         + (", ..." if len(counts) > 12 else ""))
        else:
            lines.append(f"outputs: {', '.join(s.classes)}")
        if self.short_sides:
            modes = ", ".join(f"{m} {n}" for m, n in self.modes.most_common())
            lines.append(f"short sides of {len(self.short_sides)} sampled images: median "
                         f"{self.median_side} px (from {min(self.short_sides)} to {max(self.short_sides)}); "
                         f"modes: {modes}")
        if self.copies:
            lines.append(f"{self.copies} files are byte-identical copies of others (check-data lists them)")
        shape = aspect_notice(statistics.median(self.aspects), 0.875) if self.aspects else None
        if shape:
            lines.append(shape[0].upper() + shape[1:])
        return lines


def survey(data_dir: str, labels: str | None = None) -> Survey:
    """The data read once, with the splits training will make; a one-line error when it is unusable."""
    root = Path(data_dir)
    if labels is not None:
        from project.data.tables import discover_table, read_table

        splits = discover_table(labels, data_dir)
        given = sorted({r.split for r in read_table(labels, data_dir).rows if r.split},
                       key=("train", "val", "test").index)
    else:
        problems = structure_problems(root)
        if problems:
            raise DataFolderError("; ".join(problems))
        splits = discover(root)
        base, _, split_dirs = layout(root)
        given = [] if base == root else ["train", *split_dirs]
    found = Survey(str(data_dir), labels, splits, given)
    paths = [s.path for s in (*splits.train, *splits.val, *splits.test)]
    step = max(1, len(paths) // HEADERS)
    for path in paths[::step][:HEADERS]:
        try:
            with Image.open(path) as img:  # the header only: nothing is decoded
                found.short_sides.append(min(img.size))
                found.aspects.append(max(img.size) / max(1, min(img.size)))
                found.modes[img.mode] += 1
        except (OSError, ValueError):
            found.modes["unreadable"] += 1
    groups = content_groups(paths)
    found.copies = len(groups) - len(set(groups))
    return found


def weights_size(backbone: str, weights: str | None) -> int:
    """The input size the weights were trained at (224 for torchvision's ImageNet weights)."""
    from project.model.backbones import resolve_preprocessing

    return resolve_preprocessing(backbone, weights, Input(size=None)).image_size


def round8(x: float) -> int:
    return int(round(x / 8)) * 8


def fixed_size(backbone: str) -> tuple[str, object, str] | None:
    """The input size setting of a network built for one size alone (torchvision's ViTs), or
    None: at the images' size such a network would refuse to start."""
    import torch
    import torchvision

    try:
        with torch.device("meta"):  # the shapes alone: no memory, no time
            net = torchvision.models.get_model(backbone, weights=None)
    except (ValueError, TypeError, RuntimeError):  # not a torchvision name (timm, a user's network)
        return None
    needs = getattr(net, "image_size", None)
    return ("model.input.size", needs, f"{backbone} is built for {needs} px images alone") if isinstance(
        needs, int) else None


def choices(found: Survey, weights: str | None, backbone: str, name: str,
            own_backbone: bool = False) -> list[tuple[str, object, str]]:
    """(setting, value, what in the data chose it) for every data-derived setting."""
    from project.model.backbones import is_scratch

    median = found.median_side
    out: list[tuple[str, object, str]] = [
        ("trainer.logger.init_args.name", name, f"the data folder's name: runs go to logs/{name}/version_N/"),
        *([("model.backbone", backbone, "init --backbone")] if own_backbone else []),
        ("model.weights", weights, "random weights (init --weights null)" if is_scratch(weights)
         else "init --weights: the backbone starts from them"),
    ]
    if is_scratch(weights):
        size = min(384, max(32, round8(median)))
        out.append(fixed_size(backbone) or ("model.input.size", size, f"random weights: near the images' "
                   f"median short side ({median} px), at least 32, at most 384"))
        scratch = yaml.safe_load(SCRATCH_PRESET.read_text())["model"]
        why = "random weights: configs/presets/scratch.yaml's"
        schedule = scratch["scheduler"]["init_args"]
        out += [lr_choice(found, scratch["lr"], f"{why} (every layer is new)"),
                *[(f"model.scheduler.init_args.{k}", v, why) for k, v in schedule.items()]]
    else:
        own = weights_size(backbone, weights)
        if median * 4 < own:
            size = min(own, max(64, round8(2 * median)))
            why = (f"the images (median short side {median} px) are much smaller than the weights' "
                   f"{own} px: twice their size, at least 64")
        else:
            size, why = own, f"the weights' own size (the images' median short side is {median} px)"
        if fixed_size(backbone):  # built for one size: the weights' own
            size, why = own, f"{backbone} is built for its weights' {own} px images alone"
        out.append(("model.input.size", size, why))
        if found.task.lr_scale != 1:
            base = yaml.safe_load(TRAIN_CONFIG.read_text())["model"]["lr"]
            out.append(lr_choice(found, base, "configs/train.yaml's fine-tuning LR"))
    if is_scratch(weights) or median <= SMALL:  # photos' crops and jitter, measured in docs/accuracy.md
        why = "random weights" if is_scratch(weights) else f"small images ({median} px)"
        out += [("data.augmentation.crop_scale", [0.8, 1.0], f"{why}: crops that keep most of the image, "
                 "as a plain loop (docs/accuracy.md, init's config)"),
                ("data.augmentation.color_jitter", 0.0, f"{why}: no colour jitter, as a plain loop")]
    if median <= SMALL:
        out.append(("model.input.crop_ratio", 1.0, f"small images ({median} px): evaluation sees the "
                    "whole image, a center crop would cut their edges"))
    elif found.labels_per_image > 1.2:
        out.append(("model.input.crop_ratio", 1.0, f"{found.labels_per_image:.1f} labels per image: what "
                    "sits at the border counts too (configs/presets/tiles.yaml)"))
    out = with_eval_crop_in_scale(out, backbone, weights)
    out.append(("data.augmentation.hflip", 0.5, "kept, but check: nothing in the images says whether a "
                "mirrored one is still its class (digits, text: 0.0)"))
    out.append(("data.data_dir", found.data_dir, "init's DATA"))
    out.append(("data.labels", found.labels, "init --labels" if found.labels else "class folders: no table"))
    if "val" not in found.given_splits:
        held = "val and test" if "test" not in found.given_splits else "val"
        kind = "the table has no split column" if found.labels else (
            "train/ has no val/ beside it" if found.given_splits else "one folder of class folders")
        out.append(("data.val_fraction", 0.15, f"{kind}: a seeded, stratified split makes {held}"))
        if held == "val and test":
            out.append(("data.test_fraction", 0.15, "the test set for evaluate, split off the same way"))
    out += balance(found)
    return out


def with_eval_crop_in_scale(out: list[tuple[str, object, str]], backbone: str,
                            weights: str | None) -> list[tuple[str, object, str]]:
    """A ``crop_scale`` chosen here reaches down to the share of the image evaluation's center crop
    keeps: else every fit would warn that objects look another size in evaluation."""
    from project.model.backbones import resolve_preprocessing

    picked = {key: value for key, value, _ in out}
    scale = picked.get("data.augmentation.crop_scale")
    ratio = picked.get("model.input.crop_ratio") or resolve_preprocessing(
        backbone, weights, Input(size=None)).crop_ratio
    if scale is None or scale[0] <= ratio ** 2:
        return out
    low = int(ratio ** 2 * 100) / 100
    return [(key, [low, scale[1]], f"{why}, from {low:g}: the share evaluation's center crop keeps")
            if key == "data.augmentation.crop_scale" else (key, value, why) for key, value, why in out]


def lr_choice(found: Survey, base: float, why: str) -> tuple[str, object, str]:
    """The weights' usual LR times the task's scale: a loss that averages over every output (BCE)
    gives each logit a smaller gradient than softmax's, so its plain loop wants a higher LR."""
    scale = found.task.lr_scale
    task = f", x{scale:g} for the {found.task.name} task" if scale != 1 else ""
    return ("model.lr", base * scale, why + task)


def balance(found: Survey) -> list[tuple[str, object, str]]:
    """Balanced draws (or, for a task without one class per image, balanced loss weights) when the
    largest class has over IMBALANCE times the images of the smallest."""
    counts = found.counts
    if not counts or min(counts.values()) == 0:
        return []
    big, small = max(counts, key=counts.get), min(counts, key=counts.get)
    ratio = counts[big] / counts[small]
    if ratio <= IMBALANCE:
        return []
    why = f"'{big}' has {counts[big]} training images, {ratio:.1f}x '{small}' ({counts[small]})"
    targets = [s.label for s in found.splits.train]
    try:
        found.task.sample_weights(targets, len(counts))
        return [("data.balanced_sampling", True, f"{why}: every class drawn as often")]
    except ConfigError:  # no one class per image to draw by
        if "balanced_weights" in found.task.summarise_labels(targets, len(counts)):
            return [("model.class_weights", "balanced", f"{why}: the loss weighs the rare ones up")]
    return []


# -- the config: configs/train.yaml's lines with the chosen values --------------------------------
KEY_LINE = re.compile(r"^(\s*)(- +)?([A-Za-z_]\w*):(?:\s|$)")
COMMENT_COLUMN = 31  # where configs/train.yaml's comments start


def key_paths(lines: list[str]) -> list[tuple[int, str, int]]:
    """(line number, dotted key, indent) of every mapping key (keys inside list items are not
    addressable: their path holds '-')."""
    stack: list[tuple[int, str]] = []
    found = []
    for i, line in enumerate(lines):
        m = KEY_LINE.match(line)
        if not m:
            continue
        indent = len(m.group(1))
        while stack and stack[-1][0] >= indent:
            stack.pop()
        if m.group(2):
            stack.append((indent, "-"))
            indent += len(m.group(2))
        stack.append((indent, m.group(3)))
        found.append((i, ".".join(k for _, k in stack), indent))
    return found


def yaml_value(value: object) -> str:
    return yaml.safe_dump(value, default_flow_style=True, width=1000).strip().removesuffix("...").strip()


def set_key(lines: list[str], key: str, value: object, why: str) -> None:
    """Set ``key`` in ``lines`` to ``value`` with the comment ``why``; a key the lines lack is added
    at the end of its parent's block."""
    paths = key_paths(lines)
    leaf = key.rsplit(".", 1)[-1]
    found = [(i, indent) for i, path, indent in paths if path == key]
    if found:
        i, indent = found[0]
    else:
        parent = key.rsplit(".", 1)[0]
        inside = [(i, ind) for i, p, ind in paths if p == parent or p.startswith(parent + ".")]
        if not inside:
            raise ConfigError(f"{TRAIN_CONFIG} has no {parent} section for {key}")
        i, indent = inside[-1][0], inside[0][1] + 2
        i += 1
        lines.insert(i, "")
    text = f"{' ' * indent}{leaf}: {yaml_value(value)}"
    lines[i] = f"{text.ljust(COMMENT_COLUMN - 1)} # {why}"


def write_config(found: Survey, settings: list[tuple[str, object, str]], out: Path, command: str) -> None:
    lines = TRAIN_CONFIG.read_text().splitlines()
    while lines and lines[0].startswith("#"):  # train.yaml's own head: replaced by the data's
        lines.pop(0)
    for key, value, why in settings:
        set_key(lines, key, value, why)
    head = [f"# Written by: {command}", "# from what the data holds:",
            *[f"#   {line}" for line in found.describe()],
            "# Each setting the data chose says why; the rest is configs/train.yaml's. Edit freely."]
    text = "\n".join([*head, *lines]) + "\n"
    yaml.safe_load(text)  # a value that breaks the YAML fails here, before anything is written
    write_text(out, text)


def run_name(data_dir: str) -> str:
    name = re.sub(r"[^\w.-]+", "-", Path(data_dir).resolve().name).strip("-.")
    return name or "run"


def check_out(out: Path, force: bool, data_dir: str) -> None:
    """Under configs/, overwrite only a config that init wrote: configs/train.yaml is every init's
    template, and the demo's, the sweep's and the presets are the project's own (a data folder
    named train/ would otherwise replace the template of every later init)."""
    if not out.exists():
        return
    other = f"configs/{run_name(str(Path(data_dir).resolve().parent))}-{run_name(data_dir)}.yaml"
    ours = REPO / "configs" in out.resolve().parents
    if ours and not out.read_text(errors="replace").startswith("# Written by: python -m project init"):
        raise ProjectError(f"--out '{out}' is one of the project's own configs, not one that init "
                           f"wrote: init never overwrites those; give another, e.g. --out {other} "
                           f"(make init: ARGS=\"--out {other}\")")
    if not force:
        raise ProjectError(f"--out '{out}' exists; pass --force to overwrite it (make init: ARGS=--force), "
                           "or another --out")


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m project init", description=__doc__.split("\n")[0])
    p.add_argument("data", help="the data folder (class folders, train/val/test, or the images of --labels)")
    p.add_argument("--labels", default=None, help="a labels table (image,label | labels | numbers)")
    p.add_argument("--weights", default="DEFAULT", help="DEFAULT (ImageNet), null (random), or a file")
    p.add_argument("--backbone", default=None,
                   help="the network (make models lists them); default: configs/train.yaml's")
    p.add_argument("--out", default=None, help="the config to write (default configs/NAME.yaml)")
    p.add_argument("--force", action="store_true", help="overwrite --out if it exists")
    a = p.parse_args(argv)
    weights = None if a.weights.lower() in ("null", "none") else a.weights
    if weights is not None and ("/" in weights or "." in weights) and not Path(weights).is_file():
        raise ConfigError(f"--weights '{weights}' is not a file; give DEFAULT, null or the path of a "
                          ".pth, .ckpt or .safetensors file")
    name = run_name(a.data)
    out = Path(a.out or f"configs/{name}.yaml")
    check_out(out, a.force, a.data)
    found = survey(a.data, a.labels)
    if not found.splits.val:  # a config whose fit would stop at once is not written
        fraction = inspect.signature(discover).parameters["val_fraction"].default
        raise DataFolderError(f"the val split of '{a.data}' would be empty: "
                              f"{empty_split_fix(a.data, 'val', fraction)}")
    backbone = a.backbone or yaml.safe_load(TRAIN_CONFIG.read_text())["model"]["backbone"]
    settings = choices(found, weights, backbone, name, own_backbone=a.backbone is not None)
    command = " ".join(["python -m project init", *argv])
    write_config(found, settings, out, command)
    print("\n".join(found.describe()))
    for key, value, why in settings:
        print(f"  {key}: {yaml_value(value)}  ({why})")
    print(f"wrote {out}; next:\n  make train CONFIG={out}    # python -m project fit --config {out}\n"
          "  make evaluate    # python -m project evaluate: the newest run's best checkpoint, test split")
    return 0
