"""Fuzz of every setting and every command's file arguments (full tier): a bad value ends in exit
status 2 and exactly one ``error:`` line that names the key (or the file), with no traceback and
nothing new under logs/ or exports/; a labels table either works or is refused in that one line.
Everything runs in this process (``project.cli.main``, LightningCLI's parser built once) and stops
before any training: ``fit`` does what it does before its first step (``dry_fit``), then returns.
VALID and REPORTED list, with the reason, the inputs that are rightly not refused."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

from project.cli import ProjectCLI
from tests.conftest import EMA_PRESET, QUICK, TRAIN_CONFIG, cli, fit_args, free_port, only_run

pytestmark = pytest.mark.slow

TRIED: list[str] = []  # every input the tests below ran, counted at the end

# ---------------------------------------------------------------------------------------------
# The settings: each key `fit --print_config` shows under model. and data., with its kind. A key
# the config grows without an entry here fails tests/test_slips.py's test_every_printed_key_has_a_kind.
KINDS = {
    "model.loss": "name", "model.backbone": "name", "model.weights": "file",
    "model.head.kind": "choice", "model.head.hidden": "count", "model.head.dropout": "share",
    "model.input.size": "count", "model.input.crop_ratio": "share", "model.input.interpolation": "choice",
    "model.input.mean": "triple", "model.input.std": "triple",
    "model.optimizer.class_path": "name",
    "model.optimizer.init_args.lr": "positive", "model.optimizer.init_args.momentum": "share",
    "model.optimizer.init_args.dampening": "share", "model.optimizer.init_args.weight_decay": "positive",
    "model.optimizer.init_args.nesterov": "bool", "model.optimizer.init_args.maximize": "bool",
    "model.optimizer.init_args.foreach": "bool", "model.optimizer.init_args.differentiable": "bool",
    "model.optimizer.init_args.fused": "bool",
    "model.scheduler.class_path": "name",
    "model.scheduler.init_args.warmup_epochs": "positive",
    "model.scheduler.init_args.warmup_start_factor": "share",
    "model.scheduler.init_args.end_factor": "share", "model.scheduler.init_args.max_warmup_share": "share",
    "model.scheduler.init_args.total_steps": "count", "model.scheduler.init_args.steps_per_epoch": "count",
    "model.scheduler.init_args.last_epoch": "int", "model.scheduler.init_args.cosine_interval": "choice",
    "model.lr": "positive", "model.head_lr_mult": "positive", "model.layer_decay": "share",
    "model.lr_scaling": "choice", "model.base_batch_size": "count", "model.label_smoothing": "share",
    "model.mixup_alpha": "positive", "model.cutmix_alpha": "positive", "model.class_weights": "floats",
    "model.channels_last": "bool", "model.compile": "bool", "model.min_confidence": "share",
    "data.data_dir": "folder", "data.labels": "file", "data.task": "choice", "data.batch_size": "count",
    "data.num_workers": "count", "data.pin_memory": "bool", "data.persistent_workers": "bool",
    "data.prefetch_factor": "count",
    "data.augmentation.hflip": "share", "data.augmentation.vflip": "share",
    "data.augmentation.crop_scale": "pair", "data.augmentation.color_jitter": "share",
    "data.augmentation.auto_augment": "choice", "data.augmentation.random_erasing": "share",
    "data.val_fraction": "share", "data.test_fraction": "share", "data.split_seed": "int",
    "data.seed": "int", "data.balanced_sampling": "bool", "data.cache": "choice",
    "data.cache_gb": "positive", "data.decode_side": "count", "data.on_bad_image": "choice",
    "data.extra_val": "folders",
    "data.unlabeled.images": "folder", "data.unlabeled.method": "choice", "data.unlabeled.ratio": "count",
    "data.unlabeled.threshold": "share", "data.unlabeled.weight": "positive",
}
# kind -> the bad values tried for it (as typed after `--key=`): wrong type, negative, zero, NaN,
# huge, empty string; for paths the placeholders of files() (a missing path, a folder where a file
# is wanted, an empty, a text and a binary file)
BAD = {
    "int": ["abc", "1.5", "nan", "''"],
    "count": ["abc", "-1", "0", "''", "99999999999999999999"],
    "positive": ["abc", "-1", "nan", "1e400"],
    "share": ["abc", "-0.01", "1.01", "nan"],
    "bool": ["maybe", "2", "''"],
    "choice": ["nonsense", "''", "0"],
    "name": ["''", "no_such_thing_42", "x" * 300],
    "triple": ["abc", "[0,0,0]", "[nan,nan,nan]", "[1e400,1,1]", "[]"],
    "pair": ["abc", "[-1,0.5]", "[nan,1]", "[]", "[0.9,0.1]"],
    "floats": ["abc", "[-1,1,1,1,1]", "[0,0,0,0,0]", "[nan,1,1,1,1]", "[1e400,1,1,1,1]", "[1]"],
    "file": ["''", "MISSING", "DIRECTORY", "EMPTY", "TEXT", "BINARY"],
    "folder": ["''", "MISSING", "EMPTY_DIRECTORY", "TEXT", "BINARY"],
    "folders": ["abc", "{a: MISSING}", "{a: TEXT}", "{a: EMPTY_DIRECTORY}", "{'b c': DATA}"],
}
# The values of BAD that are valid for one key, each with why. They are not run (a valid setting
# goes on to train); every other value must fail in one line.
SGD_ACCEPTS = "model.optimizer is any torch.optim class, whose own checks are the rule: SGD takes it"
VALID = {
    ("model.loss", "''"): "an empty name is the task's default loss, as null",
    ("model.head.hidden", "99999999999999999999"): "the default linear head has no hidden layer",
    ("model.base_batch_size", "99999999999999999999"): "read only by lr_scaling (none by default)",
    ("model.input.mean", "[0,0,0]"): "no shift: any finite mean is (Guards names an input out of range)",
    ("model.optimizer.init_args.weight_decay", "1e400"): SGD_ACCEPTS,
    ("model.optimizer.init_args.momentum", "1.01"): SGD_ACCEPTS,
    ("model.optimizer.init_args.dampening", "-0.01"): SGD_ACCEPTS,
    ("model.optimizer.init_args.dampening", "1.01"): SGD_ACCEPTS,
    ("model.scheduler.init_args.total_steps", "99999999999999999999"): "a schedule longer than the run",
    ("model.scheduler.init_args.steps_per_epoch", "99999999999999999999"): "a warmup longer than the run "
                                                                           "(clipped to max_warmup_share)",
    ("data.batch_size", "99999999999999999999"): "a batch larger than a split is the whole split",
    ("data.num_workers", "0"): "0 workers: the main process loads the images (the CPU default)",
    ("data.prefetch_factor", "99999999999999999999"): "a worker prefetches at most the epoch's batches",
    ("data.decode_side", "99999999999999999999"): "decodes at full size, as data.decode_side=full",
    ("data.cache_gb", "1e400"): "no limit on the decoded-image cache",
    ("data.unlabeled.ratio", "99999999999999999999"): "as data.batch_size: memory is the limit",
}


def files(where: Path, data: Path) -> dict[str, str]:
    """The placeholders of BAD, made under ``where``: paths that are no file or folder of use."""
    where.mkdir(parents=True, exist_ok=True)
    (where / "empty_dir").mkdir(exist_ok=True)
    (where / "empty.txt").write_bytes(b"")
    (where / "notes.txt").write_text("just some notes,\nnot what you want here\n" * 10)
    (where / "noise.bin").write_bytes(bytes(range(256)) * 64)
    return {"MISSING": str(where / "missing"), "DIRECTORY": str(where / "empty_dir"),
            "EMPTY_DIRECTORY": str(where / "empty_dir"), "EMPTY": str(where / "empty.txt"),
            "TEXT": str(where / "notes.txt"), "BINARY": str(where / "noise.bin"), "DATA": str(data)}


def fill(value: str, paths: dict[str, str]) -> str:
    for name in sorted(paths, key=len, reverse=True):
        value = value.replace(name, paths[name])
    return value


def dry_fit(self, subcommand: str) -> None:
    """In place of the trainer's run: what fit does before the first step that a setting can
    fail (the data splits and transforms, the optimizer and the LR schedule), then stop."""
    for logger in self.trainer.loggers:  # Lightning makes the run folder first
        _ = logger.experiment
    self.datamodule.setup("fit")
    self.model.trainer = self.trainer
    self.model.setup("fit")
    configured = self.model.configure_optimizers()
    if isinstance(configured, dict):
        configured["lr_scheduler"]["scheduler"].build({"total_steps": 40, "steps_per_epoch": 4, "epochs": 10})


PARSERS: dict = {}


def one_parser(self, add_subcommands: bool, main_kwargs: dict, subparser_kwargs: dict) -> None:
    """LightningCLI's parser, built once and kept (a third of what a refused setting costs)."""
    if "fit" not in PARSERS:
        SETUP_PARSER(self, add_subcommands, main_kwargs, subparser_kwargs)
        PARSERS["fit"] = (self.parser, self._subcommand_method_arguments, self._subcommand_parsers,
                          self.parsers)
    self.parser, self._subcommand_method_arguments, self._subcommand_parsers, self.parsers = PARSERS["fit"]


SETUP_PARSER = ProjectCLI.setup_parser


@pytest.fixture
def no_training(monkeypatch):
    """Nothing here may train: fit stops before its first step, and a command that would train
    anyway (suspects) or serve fails the test instead."""
    import lightning.pytorch as pl

    monkeypatch.setattr(ProjectCLI, "_run_subcommand", dry_fit)

    def refuse(*args, **kwargs):
        raise AssertionError("this input went on to train or serve")

    monkeypatch.setattr(pl.Trainer, "fit", refuse)
    import litserve

    monkeypatch.setattr(litserve.LitServer, "run", refuse)


def outputs(cwd: Path) -> set[Path]:
    return {p for d in ("logs", "exports") for p in (cwd / d).rglob("*")}


def names_it(key: str, line: str, after: str, given: str) -> bool:
    """The error names the key: whole, or its group (model.head, the optimizer's class) and its own
    name after it (jsonargparse's ``Parser key "data.augmentation":`` then the field on the next
    lines), or, for a file or folder, the path the user gave (the convention of the errors here)."""
    if ".init_args." in key:  # torch words the optimizer's settings its own way: the group
        return key.split(".init_args.")[0] in line
    group, _, leaf = key.rpartition(".")
    if "." not in group:  # model.lr: the key, or one of a pair (model.lr/head_lr_mult)
        return key in line or f"/{leaf} " in line or (given.startswith("/") and given in line)
    return (key in line or (group in line and leaf in line + after)
            or (given.startswith("/") and given in line))


def refused(args: list[str], cwd: Path, capsys, key: str) -> str | None:
    """Run ``args``; None when it ended as a bad input must, else what went wrong."""
    TRIED.append(" ".join(args))
    before = outputs(cwd)
    capsys.readouterr()
    try:
        rc = cli(args, cwd)
    except Exception as err:  # noqa: BLE001  (reported with the input, as a traceback would be)
        return f"raised {type(err).__name__}: {str(err)[:300]}"
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("error: ")]
    if rc != 2:
        return f"exit {rc}, stderr tail {err[-300:]!r}"
    if "Traceback" in err:
        return f"traceback: {err[-500:]}"
    if len(errors) != 1:
        return f"{len(errors)} error lines: {errors}"
    if key and not names_it(key, errors[0], err.split(errors[0], 1)[1], args[-1].partition("=")[2]):
        return f"the error does not name {key}: {errors[0]}"
    if outputs(cwd) != before:
        return f"wrote {sorted(map(str, outputs(cwd) - before))[:3]}"
    return None


def flat(tree: dict, prefix: str) -> list[str]:
    keys = []
    for key, value in tree.items():
        if isinstance(value, dict) and value:
            keys += flat(value, f"{prefix}{key}.")
        else:
            keys.append(prefix + key)
    return keys


@pytest.mark.parametrize("key", sorted(KINDS))
def test_a_bad_setting_fails_in_one_line_naming_it(key, tiny_data, tmp_path, capsys, no_training,
                                                   monkeypatch):
    monkeypatch.setattr(ProjectCLI, "setup_parser", one_parser)
    paths = files(tmp_path / "inputs", tiny_data)
    failures = []
    for value in BAD[KINDS[key]]:
        if (key, value) in VALID:
            continue
        problem = refused(["fit", *fit_args(tiny_data, epochs=1), f"--{key}={fill(value, paths)}"],
                          tmp_path, capsys, key)
        if problem:
            failures.append(f"--{key}={value}: {problem}")
    assert not failures, "\n".join(failures)


# ---------------------------------------------------------------------------------------------
# The project's own callbacks in a preset (configs/presets/ema.yaml's `callbacks+:`): a bad value
# in the file (or given as --trainer.callbacks+=) is one line too, not jsonargparse's traceback
# of the callback list.
CALLBACK_SETTINGS = {"decay: 0.998": ["decay: 1.5", "decay: .nan"], "every_n_steps: 2": ["every_n_steps: x"]}
APPENDED = [("ema.EMA", "decay", 1.5), ("guards.Guards", "max_abs_input", -1),  # --trainer.callbacks+=
            ("guards.Guards", "patience_with_scaler", -1), ("guards.Guards", "top", -2),
            ("dashboards.Dashboards", "top_pairs", -1)]


def test_bad_callback_settings_in_the_config_fail_in_one_line(tiny_data, tmp_path, capsys, no_training,
                                                              monkeypatch):
    monkeypatch.setattr(ProjectCLI, "setup_parser", one_parser)
    text, failures = EMA_PRESET.read_text(), []
    for good, bads in CALLBACK_SETTINGS.items():
        assert text.count(good) == 1, good
        for bad in bads:
            preset = tmp_path / "ema.yaml"
            preset.write_text(text.replace(good, bad))
            args = ["fit", *fit_args(tiny_data, f"--config={preset}", epochs=1)]
            if problem := refused(args, tmp_path, capsys, f"trainer.callbacks.{good.split(':')[0]}"):
                failures.append(f"{bad}: {problem}")
    for name, key, value in APPENDED:
        added = (f'--trainer.callbacks+={{"class_path": "project.callbacks.{name}", '
                 f'"init_args": {{"{key}": {value}}}}}')
        if problem := refused(["fit", *fit_args(tiny_data, epochs=1), added], tmp_path, capsys,
                              f"trainer.callbacks.{key}"):
            failures.append(f"{added}: {problem}")
    assert not failures, "\n".join(failures)


# ---------------------------------------------------------------------------------------------
# Every command's file arguments. {} is the bad file; CKPT, DATA, OUT and PORT are filled in.
BAD_FILES = ["MISSING", "DIRECTORY", "EMPTY", "TEXT", "BINARY", "TRUNC_CKPT", "TRUNC_ONNX"]  # cut: for models
FILE_ARGUMENTS = {
    "fit --ckpt_path": ["fit", *fit_args(Path("DATA"), epochs=1), "--ckpt_path={}"],
    "test --ckpt_path": ["test", "--config", str(TRAIN_CONFIG), "--data.data_dir=DATA", "--ckpt_path={}"],
    "predict --ckpt_path": ["predict", "--ckpt_path", "{}", "--input", "DATA/test"],
    "predict --input": ["predict", "--ckpt_path", "CKPT", "--input", "{}"],
    "export --ckpt_path": ["export", "--ckpt_path", "{}"],
    "export --data_dir": ["export", "--ckpt_path", "CKPT", "--data_dir", "{}", "--out", "OUT"],
    "serve --ckpt_path": ["serve", "--ckpt_path", "{}", "--port", "PORT"],
    "serve --onnx": ["serve", "--onnx", "{}", "--port", "PORT"],
    "evaluate CKPT": ["evaluate", "{}"],
    "calibrate --ckpt_path": ["calibrate", "--ckpt_path", "{}"],
    "calibrate --data_dir": ["calibrate", "--ckpt_path", "CKPT", "--data_dir", "{}"],
    "resume RUN_DIR": ["resume", "{}"],
    "suspects --data.data_dir": ["suspects", "--config", str(TRAIN_CONFIG), "--data.data_dir={}"],
    "suspects --method refit --data.data_dir": ["suspects", "--method", "refit", "--config",
                                                str(TRAIN_CONFIG), "--data.data_dir={}"],
    "check-data": ["check-data", "{}"],
    "check-data --labels": ["check-data", "DATA", "--labels", "{}"],
    "resize-data SRC": ["resize-data", "{}", "OUT", "--side", "16", "--workers", "1"],
    "optimize-data SRC": ["optimize-data", "{}", "OUT", "--workers", "1"],
    "infer.py MODEL": ["infer.py", "{}", "DATA/test"],
}
# check-data is a report: a folder or table it can open but not use is an ERROR finding in the
# report and exit status 1 (as a linter's); a path that is no folder or no file is exit 2
REPORTED = {("check-data", "DIRECTORY"), *(("check-data --labels", bad) for bad in BAD_FILES[2:])}


@pytest.fixture(scope="module")
def made(tiny_data, tmp_path_factory) -> dict[str, str]:
    """A real checkpoint (one short epoch) and the bad files, among them a checkpoint and an ONNX
    model cut in half."""
    import onnx
    from onnx import TensorProto, helper

    run_cwd = tmp_path_factory.mktemp("fuzz_run")  # one step, Lightning's own checkpoint: seconds
    quick = ("--trainer.callbacks=[]", "--trainer.max_steps=1", "--trainer.num_sanity_val_steps=0")
    assert cli(["fit", *fit_args(tiny_data, *QUICK, *quick, epochs=1)], run_cwd) == 0
    ckpt = next((only_run(run_cwd / "logs") / "checkpoints").glob("*.ckpt"))
    where = tmp_path_factory.mktemp("fuzz_files")
    paths = files(where, tiny_data)
    (where / "cut.ckpt").write_bytes(ckpt.read_bytes()[: ckpt.stat().st_size // 2])
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3, 8, 8])],
                              [helper.make_tensor("w", TensorProto.FLOAT, [256], [0.5] * 256)])
    whole = onnx.helper.make_model(graph).SerializeToString()
    (where / "cut.onnx").write_bytes(whole[: len(whole) // 2])
    return {**paths, "TRUNC_CKPT": str(where / "cut.ckpt"), "TRUNC_ONNX": str(where / "cut.onnx"),
            "CKPT": str(ckpt)}


@pytest.mark.parametrize("argument", sorted(FILE_ARGUMENTS))
def test_a_bad_file_argument_fails_in_one_line(argument, made, tmp_path, capsys, no_training):
    from project.extras.deploy import infer

    failures = []
    model = any(word in argument.lower() for word in ("ckpt", "onnx", "model", "run_dir"))
    for bad in BAD_FILES if model else BAD_FILES[:5]:
        given = made[bad]
        args = [given if a == "{}" else a.replace("{}", given) for a in FILE_ARGUMENTS[argument]]
        args = [a.replace("CKPT", made["CKPT"]).replace("DATA", made["DATA"])
                .replace("OUT", str(tmp_path / "out")).replace("PORT", str(free_port())) for a in args]
        if args[0] == "infer.py":  # python project/extras/deploy/infer.py: its own main
            TRIED.append(" ".join(args))
            capsys.readouterr()
            rc, err = infer.main(args[1:]), capsys.readouterr().err
            errors = [line for line in err.splitlines() if line.startswith("error: ")]
            ok = rc == 2 and len(errors) == 1 and "Traceback" not in err and given in errors[0]
            problem = None if ok else f"exit {rc}: {err[-500:]}"
        elif (argument, bad) in REPORTED:
            TRIED.append(" ".join(args))
            capsys.readouterr()
            rc, out = cli(args, tmp_path), capsys.readouterr()
            ok = rc == 1 and "ERROR (1):" in out.out and "Traceback" not in out.err
            problem = None if ok else f"exit {rc}: {out.out[-300:]} {out.err[-300:]}"
        else:
            problem = refused(args, tmp_path, capsys, given)  # the error names the file
        if problem:
            failures.append(f"{argument} {bad}: {problem}")
    assert not failures, "\n".join(failures)


# ---------------------------------------------------------------------------------------------
# Label tables (data.labels): each either works or is one line. {rows} is `image,label` lines for
# every image of the tiny data set, with the separator and line ending asked for.
def table(data: Path, sep: str = ",", end: str = "\n", quote: bool = False, header: str = "image,label",
          label=lambda cls: cls) -> str:
    cell = (lambda s: f'"{s}"') if quote else (lambda s: s)
    rows = [sep.join(map(cell, (str(p.relative_to(data)), label(p.parent.name))))
            for p in sorted(data.rglob("*.png"))]
    return end.join([sep.join(map(cell, header.split(","))), *rows]) + end


TABLES = {  # name -> the bytes of the table, from the data folder
    "BOM": lambda d: table(d).encode("utf-8-sig"),  # works, as plain UTF-8
    "UTF-16": lambda d: table(d).encode("utf-16"),
    "latin-1 names": lambda d: table(d, label=lambda c: c + "é").encode("latin-1"),
    "semicolons": lambda d: table(d, sep=";").encode(),
    "tabs": lambda d: table(d, sep="\t").encode(),
    "quoted commas in labels": lambda d: table(d, quote=True, label=lambda c: f"{c}, big").encode(),
    "blank lines, CRLF": lambda d: table(d, end="\r\n\r\n").encode(),
    "an unclosed quote": lambda d: table(d).replace(",", ',"', 3).encode(),
    "a NUL byte": lambda d: table(d).replace("circle", "cir\0cle").encode(),
    "only the header": lambda d: b"image,label\n",
    "5000 columns": lambda d: table(d, header="image,label," + ",".join(f"c{i}" for i in range(4998)),
                                    label=lambda c: c + ",1" * 4998).encode(),
    "text in a numeric column": lambda d: table(d, header="image,value",
                                                label=lambda c: "abc" if c == "dots" else "1.5").encode(),
    "NaN in a numeric column": lambda d: table(d, header="image,value",
                                               label=lambda c: "nan" if c == "dots" else "2").encode(),
}


def works_or_one_line(args: list[str], cwd: Path, capsys) -> str | None:
    """None when ``args`` ran (exit 0, no error) or was refused in one line, else what went wrong."""
    problem = refused(args, cwd, capsys, "")
    if problem and problem.startswith("exit 0"):
        return None if "error: " not in problem and "Traceback" not in problem else problem
    return problem


@pytest.mark.parametrize("name", sorted(TABLES))
def test_a_labels_table_works_or_is_one_line(name, tiny_data, tmp_path, capsys, no_training, monkeypatch):
    monkeypatch.setattr(ProjectCLI, "setup_parser", one_parser)
    labels = tmp_path / "labels.csv"
    labels.write_bytes(TABLES[name](tiny_data))
    args = ["fit", *fit_args(tiny_data, f"--data.labels={labels}", "--data.cache=none", epochs=1)]
    assert (problem := works_or_one_line(args, tmp_path, capsys)) is None, problem


CELL = st.text(st.sampled_from('ab,;\t"\'\n\r\0é-./ 1'), max_size=12)


@seed(33)
@settings(max_examples=10, derandomize=True, deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(header=st.sampled_from(["image,label", "image,labels", "image,value", "image,label,split"]),
       rows=st.lists(st.lists(CELL, min_size=1, max_size=4), max_size=6))
def test_generated_labels_tables_work_or_are_one_line(header, rows, tiny_data, tmp_path, capsys,
                                                      no_training, monkeypatch):
    monkeypatch.setattr(ProjectCLI, "setup_parser", one_parser)
    labels = tmp_path / "labels.csv"
    labels.write_text("\n".join([header, *(",".join(r) for r in rows)]) + "\n", encoding="utf-8")
    args = ["fit", *fit_args(tiny_data, f"--data.labels={labels}", epochs=1)]
    assert (problem := works_or_one_line(args, tmp_path, capsys)) is None, problem


OUTPUTS = {  # where a command writes: a folder where it writes a file, a file where it makes a folder
    "predict --output": (["predict", "--ckpt_path", "CKPT", "--input", "DATA/test", "--output", "{}"],
                         "DIRECTORY"),
    "export --out": (["export", "--ckpt_path", "CKPT", "--formats", "onnx", "--out", "{}"], "TEXT"),
    "resize-data OUT": (["resize-data", "DATA", "{}", "--side", "16", "--workers", "1"], "TEXT"),
    "optimize-data OUT": (["optimize-data", "DATA", "{}", "--workers", "1"], "TEXT"),
}


@pytest.mark.parametrize("argument", sorted(OUTPUTS))
def test_an_output_that_cannot_be_written_fails_in_one_line(argument, made, tmp_path, capsys, no_training):
    template, bad = OUTPUTS[argument]
    args = [made[bad] if a == "{}" else a.replace("CKPT", made["CKPT"]).replace("DATA", made["DATA"])
            for a in template]
    assert (problem := refused(args, tmp_path, capsys, made[bad])) is None, problem


def test_the_fuzz_tried_at_least_300_inputs(request):
    """Last in this file: the count of the inputs above (when they all ran), for the notes."""
    here = [item for item in request.session.items if item.path == request.path]
    if len(here) < len([*KINDS, *FILE_ARGUMENTS, *TABLES, *OUTPUTS]) + 3:
        pytest.skip("only part of this file ran")
    print(f"\nfuzz inputs tried: {len(TRIED)}")
    assert len(TRIED) >= 300, len(TRIED)
