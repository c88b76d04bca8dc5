"""The README and docs/ name only what exists: files, config keys, functions and classes; the
defaults they state are the code's, and what they say the tests check names the test that does.

A renamed setting, a moved function, a changed default or a deleted test then fails here instead
of misleading a reader."""

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
    assert "make init DATA=" in first_screen and "make train CONFIG=" in first_screen  # your own data
    for link in re.findall(r"\]\((docs/[^)#]+)", text):
        assert (REPO / link).is_file(), link


LINK = re.compile(r"\]\(([^)\s]+)\)")


def anchors(doc: Path) -> set[str]:
    """The anchors of a page's headings, as GitHub makes them: lower case, punctuation dropped,
    spaces as hyphens, a repeated one numbered."""
    found: set[str] = set()
    for heading in re.findall(r"^#+\s+(.+?)\s*$", prose(doc), re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        name, n = slug, 0
        while name in found:
            n += 1
            name = f"{slug}-{n}"
        found.add(name)
    return found


@pytest.mark.parametrize("doc", DOCS, ids=[p.name for p in DOCS])
def test_every_relative_link_points_at_a_file_and_heading_that_exist(doc):
    wrong = []
    for target in LINK.findall(prose(doc)):
        if re.match(r"^[a-z]+:", target):  # a web address: not checked here
            continue
        path, _, anchor = target.partition("#")
        file = (doc.parent / path).resolve() if path else doc
        if not file.exists():
            wrong.append(f"{doc.name}: ({target}): no file {path}")
        elif anchor and (file.suffix != ".md" or anchor not in anchors(file)):
            wrong.append(f"{doc.name}: ({target}): no heading #{anchor} in {file.name}")
    assert not wrong, "\n".join(wrong)


# -- the values the docs state: defaults, and what the tests run -------------------------------
# A default named in the docs is compared with the code: a setting's with the default run
# (`fit --config configs/train.yaml --print_config`), a command option's with its parser.
# which commands' options a page speaks of, when it names an option outside a command line
PAGE_COMMANDS = {"README.md": ("serve", "predict", "export"),
                 "deployment.md": ("export", "predict", "serve", "infer"),
                 "analysis.md": ("evaluate", "suspects", "calibrate"), "sweeps.md": ("sweep",),
                 "troubleshooting.md": ("overfit", "lr-find", "find-batch-size"),
                 "your-data.md": ("check-data", "resize-data"), "streaming.md": ("optimize-data",),
                 "fewer-labels.md": ("suggest",)}
BLOCK = re.compile(r"```.*?```", re.S)
TABLE_ROW = re.compile(r"^\|(.*)\|\s*$")


class _Parsed(Exception):
    def __init__(self, parser) -> None:
        self.parser = parser


@cache
def option_defaults(command: str) -> dict[str, object]:
    """``{--option: default}`` of a project command, from the argparse parser its main builds
    (stopped at its first parse, before anything runs)."""
    import argparse
    from unittest import mock

    from project.commands import COMMANDS

    target = ("project.extras.deploy.infer:main" if command == "infer" else COMMANDS[command])
    module, function = target.split(":")
    main = getattr(__import__(module, fromlist=[function]), function)

    def stop(self, *args, **kwargs):
        raise _Parsed(self)

    with mock.patch.object(argparse.ArgumentParser, "parse_args", stop), \
            mock.patch.object(argparse.ArgumentParser, "parse_known_args", stop):
        try:
            main([])
        except _Parsed as parsed:
            return {s: a.default for a in parsed.parser._actions for s in a.option_strings}
    raise AssertionError(f"{command} parsed no arguments")


@cache
def default_run() -> dict[str, object]:
    """Every setting of the default run as ``section.key[.key]``: value, as `--print_config` shows it."""
    import io
    from contextlib import redirect_stdout

    import yaml

    from tests.conftest import TRAIN_CONFIG, cli

    out = io.StringIO()
    with redirect_stdout(out):
        assert cli(["fit", "--config", str(TRAIN_CONFIG), "--print_config"], REPO) == 0
    flat: dict[str, object] = {}

    def walk(prefix: str, value) -> None:
        flat[prefix] = value
        if isinstance(value, dict):
            for k, v in value.items():
                walk(f"{prefix}.{k}", v)

    for section, value in yaml.safe_load(out.getvalue()).items():
        walk(section, value)
    return flat


def setting(name: str) -> str:
    """A full key; a bare one (``crop_scale``) names the one setting of the default run ending so."""
    if KEY.match(name):
        return name
    found = [k for k in default_run() if k.endswith(f".{name}") and k.count(".") >= 2]
    assert len(found) == 1, f"`{name}`: {found or 'no setting'} in the default run"
    return found[0]


def value_of(text: str):
    """A value as the docs write it: `null`, 0.5, 20 %, 5 points, [0.6, 1.0], auto."""
    import yaml

    text = text.strip().strip("`").strip()
    share = re.fullmatch(r"(-?[\d.]+)\s*(%|points)", text)
    if share:
        return float(share.group(1)) / 100
    if re.fullmatch(r"-?\d*\.?\d+e-?\d+", text):  # 1e-4, which YAML reads as a string
        return float(text)
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


def same(stated, actual) -> bool:
    if isinstance(stated, list | tuple) and isinstance(actual, list | tuple):
        return len(stated) == len(actual) and all(map(same, stated, actual))
    number = isinstance(stated, int | float) and not isinstance(stated, bool)
    if number and isinstance(actual, int | float | str):
        try:
            return abs(float(actual) - stated) <= 1e-9 * max(1.0, abs(stated))
        except ValueError:
            return False
    return stated == actual or str(stated) == str(actual)


def prose(doc: Path) -> str:
    return BLOCK.sub("", doc.read_text())


def tables(doc: Path) -> list[tuple[list[str], list[list[str]]]]:
    """(header, rows) of each table of the page, cells stripped."""
    found, rows = [], []
    for line in [*prose(doc).splitlines(), ""]:
        m = TABLE_ROW.match(line.strip())
        if m:
            rows.append([c.strip() for c in re.split(r"(?<!\\)\|", m.group(1))])
        elif rows:
            found.append((rows[0], [r for r in rows[2:]]))
            rows = []
    return found


def actual_default(name: str, doc: Path):
    """The code's default of a setting (`model.lr`) or of an option (`--top`) named on ``doc``."""
    if name.startswith("--"):
        commands = PAGE_COMMANDS.get(doc.name)
        assert commands, f"{doc.name} names {name}: add the page's commands to PAGE_COMMANDS"
        values = [option_defaults(c)[name] for c in commands if name in option_defaults(c)]
        assert values, f"{doc.name}: no {name} in {', '.join(commands)}"
        return values  # an option of several of the page's commands: one of their defaults
    return default_run()[setting(name)]


def stated_defaults(doc: Path) -> list[tuple[str, str, object]]:
    """(where, name, stated value) for each default the page states:
    - a table with a `default` column: `key` | value (several keys: values separated by commas);
    - a table headed by a setting or option: the row marked `(default)`, or `(default X)`;
    - in prose, `key` (NUMBER) or `--option` (default NUMBER): 20 %, 5 points, 1e-4;
    - in a command line, `python -m project CMD ... [--option VALUE]`: a single plain value is
      the default (alternatives are written a|b, placeholders in capitals)."""
    found = []
    for header, rows in tables(doc):
        if len(header) > 1 and header[1].lower() == "default":
            for row in rows:
                names = CODE_SPAN.findall(row[0])
                cell = re.split(r"\s+\(| in `", row[1])[0]
                values = [cell] if len(names) == 1 else cell.split(", ")
                values = values * len(names) if len(values) == 1 else values  # one value for all
                assert len(values) == len(names), f"{doc.name}: {row}"
                found += [(f"{doc.name} table", n, value_of(v)) for n, v in zip(names, values, strict=True)]
        head = CODE_SPAN.fullmatch(header[0])
        if head and (KEY.match(head.group(1)) or head.group(1).startswith("--")):
            for row in rows:
                m = (re.search(r"`([^`]+)`\s*\(default\)", row[0])
                     or re.search(r"\(default `([^`]+)`\)", row[0]))
                if m:
                    found.append((f"{doc.name} table of {head.group(1)}", head.group(1),
                                  value_of(m.group(1))))
    text = prose(doc)
    for m in re.finditer(r"`((?:model|data|trainer)\.[\w.]+|--\w+|[a-z]+_[a-z_]+)`\s*"
                         r"\((?:default )?(-?\d[\d.,]*(?:e-?\d+)?(?:\s*%|\s+points)?)[;,)]", text):
        name, value = m.group(1), m.group(2).replace(",", "")
        if name.startswith(("--", "model.", "data.", "trainer.")) or any(
                k.endswith(f".{name}") for k in default_run()):
            found.append((f"{doc.name} text", name, value_of(value)))
    for block in BLOCK.findall(doc.read_text()):
        lines = block.replace("\\\n", " ")  # a command continued on the next line
        for command in re.finditer(r"python -m (project(?:\.extras\.deploy\.infer)?) +([\w-]*)(.*)", lines):
            name = "infer" if command.group(1) != "project" else command.group(2)
            if name in ("fit", "validate", "test", ""):
                continue
            defaults = option_defaults(name)
            for option, value in re.findall(r"\[(--\w+) ([^\]\s|]+)\]", command.group(3)):
                if value.isupper() or value in ("...", "N", "K", "S"):
                    continue
                found.append((f"{doc.name} `python -m project {name}`", option, (defaults, value_of(value))))
    return found


@pytest.mark.parametrize("doc", DOCS, ids=[p.name for p in DOCS])
def test_every_default_the_docs_state_is_the_code_s(doc):
    wrong = []
    for where, name, stated in stated_defaults(doc):
        if isinstance(stated, tuple):  # an option of a command line: its own parser's default
            defaults, stated = stated
            assert name in defaults, f"{where}: no option {name}"
            actual = defaults[name]
        else:
            actual = actual_default(name, doc)
        if name.startswith("--") and isinstance(actual, list):
            actual = next((a for a in actual if same(stated, a)), actual[0] if len(actual) == 1 else actual)
        if not same(stated, actual):
            wrong.append(f"{where}: `{name}` is said to default to {stated!r}; the code's is {actual!r}")
    assert not wrong, "\n".join(wrong)


def test_the_docs_state_defaults_the_checks_can_see():
    """The mechanism above finds what the pages say (a parser that found nothing would pass)."""
    stated = {(w.split()[0], n) for doc in DOCS for w, n, _ in stated_defaults(doc)}
    for claim in [("your-data.md", "model.input.size"), ("your-data.md", "crop_scale"),
                  ("your-data.md", "data.cache_gb"), ("scaling.md", "data.num_workers"),
                  ("scaling.md", "trainer.precision"), ("scaling.md", "model.lr_scaling"),
                  ("configuration.md", "model.head_lr_mult"), ("configuration.md", "warmup_epochs"),
                  ("deployment.md", "--check_images"), ("deployment.md", "--timing_batches"),
                  ("deployment.md", "--max_upload_mb"), ("analysis.md", "--target_acc"),
                  ("sweeps.md", "--pruner"), ("sweeps.md", "--max_failures")]:
        assert claim in stated, claim


def test_serving_batches_only_when_asked():
    """Batching is off unless --max_batch_size is given: every sentence on batching says so."""
    defaults = option_defaults("serve")
    assert defaults["--max_batch_size"] == 1 and defaults["--batch_timeout"] == 0
    for doc in DOCS:
        for sentence in re.split(r"(?<=[.;:])\s", " ".join(prose(doc).split())):
            if re.search(r"\bbatch(es|ing)?\b.*concurrent requests", sentence):
                assert "--max_batch_size" in sentence, f"{doc.name}: {sentence}"


# what a sentence that says the tests run or check something must name: a test file or test
TEST_CLAIM = re.compile(r"\b(the tests|the (test )?suite|unit tests?)\b", re.I)
NOT_TESTED = re.compile(r"\b(not (covered|part of|run|tested)|do not cover|no test)\b", re.I)


def claim_units(doc: Path) -> list[str]:
    """Paragraphs, list items and table rows of a page, each on one line."""
    units = []
    for paragraph in re.split(r"\n\s*\n", prose(doc)):
        for unit in re.split(r"\n(?=- |\| |\d+\. )", paragraph):
            if not unit.lstrip().startswith("#"):  # a heading claims nothing
                units.append(" ".join(unit.split()))
    return units


@cache
def defined_tests() -> frozenset[str]:
    return frozenset(node.name for path in (REPO / "tests").glob("*.py")
                     for node in ast.walk(ast.parse(path.read_text()))
                     if isinstance(node, ast.FunctionDef) and node.name.startswith("test_"))


@pytest.mark.parametrize("doc", DOCS, ids=[p.name for p in DOCS])
def test_a_claim_about_the_tests_names_a_test_that_exists(doc):
    """"The tests check X" names the test file (or test) that does, and that file exists: a claim
    about what is tested cannot outlive the test."""
    wrong = []
    for unit in claim_units(doc):
        cited = re.findall(r"`(tests/[\w/]+\.py)`", unit) + [
            n for n in CODE_SPAN.findall(unit) if n.startswith("test_")]
        for name in cited:
            if not ((REPO / name).is_file() if name.startswith("tests/") else name in defined_tests()):
                wrong.append(f"{doc.name}: no {name}: {unit[:120]}")
        if TEST_CLAIM.search(unit) and not cited and not NOT_TESTED.search(unit):
            wrong.append(f"{doc.name}: names no test: {unit[:160]}")
    assert not wrong, "\n".join(wrong)


def test_make_serve_listens_where_the_readme_says():
    """`make serve  # HTTP on 127.0.0.1:8000`: the server's default host and the Makefile's PORT."""
    said = re.search(r"make serve\s+# HTTP on ([\d.]+):(\d+)", (REPO / "README.md").read_text())
    assert said, "the README no longer says where make serve listens"
    defaults = option_defaults("serve")
    port = re.search(r"^PORT \?= (\d+)$", (REPO / "Makefile").read_text(), re.M)
    assert (said.group(1), int(said.group(2))) == (defaults["--host"], int(port.group(1)))


def test_the_readme_counts_the_default_run_s_callbacks():
    import yaml

    stated = re.search(r"trainer, (\d+) callbacks", (REPO / "README.md").read_text())
    config = yaml.safe_load((REPO / "configs" / "train.yaml").read_text())
    assert stated and int(stated.group(1)) == len(config["trainer"]["callbacks"])


@pytest.mark.slow
def test_the_readme_states_the_lines_a_default_fit_loads(tiny_data, tmp_path):
    """README's "about N lines" within 5 % of what ../shared/tools/core_path.py counts."""
    import subprocess
    import sys

    tool = REPO.parent / "shared" / "tools" / "core_path.py"
    if not tool.is_file():
        pytest.skip(f"{tool} is not here (the workplace's tool that counts the loaded lines)")
    stated = re.search(r"the single-label task \(about ([\d,]+) lines\)", (REPO / "README.md").read_text())
    done = subprocess.run([sys.executable, str(tool), "fit", "--config", "configs/train.yaml",
                           f"--data.data_dir={tiny_data}", "--model.weights=null",
                           "--trainer.max_steps=2", "--trainer.limit_val_batches=2",
                           f"--trainer.logger.init_args.save_dir={tmp_path}"],
                          cwd=REPO, capture_output=True, text=True, timeout=600)
    counted = re.search(r"CORE_PATH modules=\d+ lines=(\d+)", done.stderr)
    assert stated and counted, done.stderr[-2000:]
    assert abs(int(stated.group(1).replace(",", "")) - int(counted.group(1))) <= 0.05 * int(counted.group(1))


def test_the_readme_presets_table_names_every_preset_file():
    text = (REPO / "README.md").read_text()
    table = text.split("## Presets", 1)[1].split("\n## ", 1)[0]
    named = {n for row in table.splitlines() if row.startswith("| `")
             for n in re.findall(r"`([\w-]+)`", row.split("|")[1])}
    assert named == {p.stem for p in (REPO / "configs" / "presets").glob("*.yaml")}
