"""The README and docs/ name only what exists: files, config keys, functions and classes.

A renamed setting or a moved function then fails here instead of misleading a reader."""

import ast
import inspect
import re
from functools import cache
from pathlib import Path

import lightning
import pytest
import torch
import torch.optim.swa_utils
import torchmetrics
import torchmetrics.functional.classification
import torchvision
from lightning.pytorch import callbacks, loggers, strategies

from project.data import FolderDataModule
from project.data.transforms import Augmentation
from project.model import ImageClassifier
from project.model.schedule import WarmupCosine

REPO = Path(__file__).resolve().parents[1]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
CODE_SPAN = re.compile(r"`([^`\n]+)`")
# what a run writes, placeholders and names outside the repository: not checked
NOT_HERE = ("logs/", "exports/", "data/", "path/", "OUT/", "timm/", "~/", "$", "/", "s3://", "http",
            "train/", "val/", "test/", "views/", "input/")  # the last: TensorBoard tags
OUTPUT_SUFFIXES = (".png", ".csv", ".json", ".md", ".onnx", ".pt", ".pt2", ".ckpt", ".db", ".txt")
KEY = re.compile(r"^(model|data|trainer)\.[A-Za-z_][\w.]*$")
NAME = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")


@cache
def config_keys() -> frozenset[str]:
    keys = {f"model.{k}" for k in inspect.signature(ImageClassifier).parameters}
    keys |= {f"model.scheduler.init_args.{k}" for k in inspect.signature(WarmupCosine).parameters}
    keys |= {f"data.{k}" for k in inspect.signature(FolderDataModule).parameters}
    keys |= {f"data.augmentation.{k}" for k in Augmentation.__dataclass_fields__}
    keys |= {f"trainer.{k}" for k in inspect.signature(lightning.Trainer).parameters}
    return frozenset(keys)


@cache
def known_names() -> frozenset[str]:
    """Every name and string the project defines (functions, classes, arguments, columns), and
    the public names and arguments of the library classes the docs point to."""
    names: set[str] = {"class_path", "init_args"}  # the config's own
    for path in (REPO / "project").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.ClassDef):
                names.add(node.name)
            elif isinstance(node, ast.arg):
                names.add(node.arg)
            elif isinstance(node, ast.Name | ast.Attribute) and isinstance(node.ctx, ast.Store):
                names.add(node.id if isinstance(node, ast.Name) else node.attr)
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                names |= set(re.findall(r"\w+", node.value))
    for module in (torch, torch.nn, torch.optim, torch.optim.lr_scheduler, torch.optim.swa_utils,
                   torch.utils.data, callbacks, strategies, loggers, torchvision.transforms.v2,
                   torchvision.models, torchmetrics, torchmetrics.functional,
                   torchmetrics.functional.classification, torchmetrics.classification):
        names |= set(dir(module))
    for cls in (lightning.Trainer, callbacks.ModelCheckpoint, callbacks.WeightAveraging,
                torch.optim.lr_scheduler.OneCycleLR, torch.optim.lr_scheduler.StepLR):
        names |= set(inspect.signature(cls).parameters) | set(vars(cls))
    return frozenset(names)


def spans(path: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)  # blocks: commands and output
    return CODE_SPAN.findall(text)


def problems(span: str) -> list[str]:
    """A path must exist, a config key must be a setting, a code name must be defined."""
    token = re.split(r"[=:]", span, maxsplit=1)[0].strip().rstrip("²")
    placeholder = any(c in token for c in "<>*[]|.()") and not ("/" in token or KEY.match(token))
    if (not token or token.startswith(NOT_HERE) or token.isupper() or token.endswith(OUTPUT_SUFFIXES)
            or " " in token or placeholder):
        return []
    if "/" in token:
        parts = [p for p in expand(token) if "." in p.rsplit("/", 1)[-1] or p.count("/") > 1]
        return [f"no file {p}" for p in parts if not (REPO / p).exists()]
    if KEY.match(token):
        key = token
        while key not in config_keys() and key.count(".") > 1:
            key = key.rsplit(".", 1)[0]  # the init_args of a class the config names
        return [] if key in config_keys() or key.startswith("trainer.logger") else [f"no key {token}"]
    if NAME.match(token) and ("_" in token or any(c.isupper() for c in token)):
        return [] if token.split(".")[-1] in known_names() else [f"no name {token}"]
    return []


def expand(token: str) -> list[str]:
    """``a/{b,c}.py`` as ``a/b.py`` and ``a/c.py``."""
    m = re.search(r"\{([^}]*)\}", token)
    if not m:
        return [token]
    return [token[:m.start()] + option + token[m.end():] for option in m.group(1).split(",")]


@pytest.mark.parametrize("doc", DOCS, ids=[p.name for p in DOCS])
def test_every_file_key_and_name_in_the_docs_exists(doc):
    found = [f"{doc.name}: `{span}`: {p}" for span in spans(doc) for p in problems(span)]
    assert not found, "\n".join(found)


def test_the_readme_is_a_front_door():
    text = (REPO / "README.md").read_text()
    assert len(text.splitlines()) <= 250
    first_screen = "\n".join(text.splitlines()[:50])
    assert "make train" in first_screen and "make test" in first_screen
    assert "--data.data_dir=" in first_screen  # your own data, before any scrolling
    for link in re.findall(r"\]\((docs/[^)]+)\)", text):
        assert (REPO / link).is_file(), link
