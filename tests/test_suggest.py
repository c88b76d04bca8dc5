"""`python -m project suggest`: each strategy orders a hand-made pool as it promises (so a
misspelt or ignored strategy fails), the command writes to_label.csv and .png from a real
checkpoint, skipping and counting a broken file, and `--add` gives a table the reader reads."""

from __future__ import annotations

import csv
import shutil
from pathlib import Path

import pytest
import torch
from PIL import Image

from project.data.tables import read_table
from project.errors import ProjectError
from project.extras.suggest.output import FIELDS, write_csv
from project.extras.suggest.pool import Pool
from project.extras.suggest.rank import STRATEGIES, rank_images, rank_pool
from tests.conftest import CLASSES, best_ckpt, cli, one_error


def pool_of(probs: list[list[float]], embeddings: list[list[float]] | torch.Tensor | None = None,
            labeled: torch.Tensor | None = None) -> Pool:
    """A pool of images named ``0.png``, ``1.png``, ... with the given probabilities."""
    p = torch.tensor(probs)
    x = torch.as_tensor(embeddings, dtype=torch.float32) if embeddings is not None else torch.zeros(len(p), 2)
    return Pool([f"{i}.png" for i in range(len(p))], x, p, ["a", "b", "c"][:p.shape[1]],
                load_labeled=lambda: labeled)


def order(rows: list[dict]) -> list[int]:
    return [int(Path(r["image"]).stem) for r in rows]


# image 0: a tie between two classes (margin 0); image 1: three classes nearly equal (margin 0.01,
# the highest entropy); image 2: sure of one class
UNSURE = [[0.5, 0.5, 0.0], [0.34, 0.33, 0.33], [0.9, 0.05, 0.05]]


def test_margin_puts_a_near_tie_first():
    rows = rank_pool(pool_of(UNSURE), "margin", n=3)
    assert order(rows) == [0, 1, 2]
    assert [r["rank"] for r in rows] == [1, 2, 3]
    assert rows[0]["score"] == pytest.approx(0.0) and rows[1]["score"] == pytest.approx(0.01)
    assert rows[0]["suggested"] == "a" and rows[2]["suggested"] == "a"


def test_entropy_puts_the_flattest_probabilities_first():
    rows = rank_pool(pool_of(UNSURE), "entropy", n=3)
    assert order(rows) == [1, 0, 2]  # margin's first (the two-class tie) is second here
    assert rows[1]["score"] == pytest.approx(torch.log(torch.tensor(2.0)).item())


def clusters(per: int = 5, spread: float = 0.01) -> torch.Tensor:
    """Three tight clusters of ``per`` points around (0, 0), (10, 0) and (0, 10), in that order."""
    centres = torch.tensor([[0.0, 0.0], [10.0, 0.0], [0.0, 10.0]])
    gen = torch.Generator().manual_seed(0)
    return torch.cat([c + spread * torch.randn(per, 2, generator=gen) for c in centres])


def cluster_of(i: int, per: int = 5) -> int:
    return i // per


def test_k_center_first_picks_are_far_apart_and_away_from_the_labeled():
    x = clusters()
    # the least sure images all in the first cluster: margin would pick from it alone
    probs = [[0.5, 0.5]] * 5 + [[0.9, 0.1]] * 10
    picks = order(rank_pool(pool_of(probs, x), "k-center", n=3))
    assert sorted(cluster_of(i) for i in picks) == [0, 1, 2]
    assert sorted(cluster_of(i) for i in order(rank_pool(pool_of(probs, x), "margin", n=3))) == [0, 0, 0]
    labeled = torch.tensor([[0.0, 0.0], [10.0, 0.0]])  # clusters 0 and 1 are labeled already
    rows = rank_pool(pool_of(probs, x, labeled), "k-center", n=3)
    assert cluster_of(order(rows)[0]) == 2
    assert rows[0]["score"] == pytest.approx(10.0, abs=0.1)  # its distance to the nearest labeled


def test_margin_kcenter_takes_uncertain_images_from_different_clusters():
    # 20 unsure images in three clusters (A the least sure) and 20 sure ones far away (Z)
    centres = {"A": (0.0, 0.0), "B": (10.0, 0.0), "C": (0.0, 10.0), "Z": (0.0, 500.0)}
    sizes, gaps = {"A": 7, "B": 7, "C": 6, "Z": 20}, {"A": 0.0, "B": 0.04, "C": 0.1, "Z": 0.98}
    names = [c for c in centres for _ in range(sizes[c])]
    gen = torch.Generator().manual_seed(0)
    x = torch.tensor([centres[c] for c in names]) + 0.01 * torch.randn(len(names), 2, generator=gen)
    pool = pool_of([[(1 + gaps[c]) / 2, (1 - gaps[c]) / 2] for c in names], x)
    rows = rank_pool(pool, "margin-kcenter", n=2)  # k-center among the 10 x 2 least sure: A, B, C
    picked = [names[i] for i in order(rows)]
    assert len(set(picked)) == 2 and "Z" not in picked, picked
    assert [r["score"] for r in rows] == pytest.approx([gaps[c] for c in picked])  # the margin
    assert [names[i] for i in order(rank_pool(pool, "margin", n=2))] == ["A", "A"]
    assert "Z" in [names[i] for i in order(rank_pool(pool, "k-center", n=2))]  # diversity alone


def test_margin_kcenter_on_a_small_pool_picks_among_the_less_certain_half():
    # 24 images: 12 unsure ones in one tight cluster, 12 sure ones (margin 1) spread far apart;
    # with 10 x n >= the pool every image was a candidate and k-center took the sure outliers
    gen = torch.Generator().manual_seed(0)
    unsure = 0.01 * torch.randn(12, 2, generator=gen)
    sure = torch.tensor([[100.0 * (k + 1), 50.0 * (k % 3)] for k in range(12)])
    gaps = [0.02 * k for k in range(12)] + [1.0] * 12
    pool = pool_of([[(1 + g) / 2, (1 - g) / 2] for g in gaps], torch.cat([unsure, sure]))
    rows = rank_pool(pool, "margin-kcenter", n=5)
    assert len(rows) == 5 and all(i < 12 for i in order(rows)), order(rows)
    assert max(r["score"] for r in rows) < 1.0
    assert sorted(order(rank_pool(pool, "margin-kcenter", n=20))) == list(range(20))  # n over half: n


def test_random_is_seeded_repeatable_and_not_another_strategy_s_order():
    probs = [[0.5 + i / 100, 0.5 - i / 100] for i in range(30)]
    pool = pool_of(probs, clusters(per=10))
    first, again = rank_pool(pool, "random", n=30, seed=3), rank_pool(pool, "random", n=30, seed=3)
    assert first == again and sorted(order(first)) == list(range(30))
    assert order(rank_pool(pool, "random", n=30, seed=4)) != order(first)
    for other in ("margin", "entropy", "k-center", "margin-kcenter"):
        assert order(rank_pool(pool, other, n=30))[:10] != order(first)[:10], other


def test_an_unknown_strategy_fails_in_one_line_naming_the_option_and_the_choices(tmp_path, capsys):
    (tmp_path / "u").mkdir()
    assert cli(["suggest", "--unlabeled", str(tmp_path / "u"), "--strategy", "margins"], tmp_path) == 2
    error = one_error(capsys.readouterr().err)
    assert "--strategy 'margins'" in error and all(name in error for name in STRATEGIES)
    with pytest.raises(ProjectError, match="--strategy"):
        rank_pool(pool_of(UNSURE), "k_center", n=1)
    (tmp_path / "labels.csv").write_text("image,label\n")  # a table, not a folder of images
    assert cli(["suggest", "--unlabeled", str(tmp_path / "labels.csv")], tmp_path) == 2
    error = one_error(capsys.readouterr().err)
    assert "--unlabeled" in error and "labels.csv" in error and "takes a folder of images" in error


def test_margin_is_refused_for_a_multilabel_model_and_k_center_works(tiny_data):
    from project.model import ImageClassifier

    model = ImageClassifier(num_classes=5, class_names=CLASSES, task="multilabel", weights=None,
                            input=32, channels_last=False).eval()
    paths = sorted(str(p) for p in (tiny_data / "test").rglob("*.png"))[:6]
    for strategy in ("margin", "entropy", "margin-kcenter"):
        with pytest.raises(ProjectError, match="multilabel.*k-center or random"):
            rank_images(model, paths, strategy, n=3)
    rows = rank_images(model, paths, "k-center", n=3)
    assert len(rows) == 3 and all(r["suggested"] == "" for r in rows)


@pytest.fixture
def unlabeled(tiny_data, tmp_path) -> Path:
    """Ten test images in nested folders (no class layout) and one broken file."""
    folder = tmp_path / "unlabeled"
    for i, image in enumerate(sorted((tiny_data / "test").rglob("*.png"))[::2][:10]):
        (folder / f"batch{i % 2}").mkdir(parents=True, exist_ok=True)
        shutil.copy(image, folder / f"batch{i % 2}" / f"img{i:02d}.png")
    (folder / "broken.png").write_bytes(b"not an image at all")
    return folder


def read_csv(path: Path) -> tuple[list[str], list[dict]]:
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        return list(reader.fieldnames or []), list(reader)


def test_suggest_writes_the_csv_and_contact_sheet_and_counts_a_broken_file(trained_run, unlabeled, tiny_data,
                                                                            tmp_path, capsys):
    run = tmp_path / "run"  # a copy: the default --out is the run's folder
    (run / "checkpoints").mkdir(parents=True)
    shutil.copy(best_ckpt(trained_run), run / "checkpoints" / "best-epoch02.ckpt")
    # a link to one of the run's training images: labeled already, so left out
    (unlabeled / "seen.png").symlink_to(sorted((tiny_data / "train").rglob("*.png"))[0])
    assert cli(["suggest", "--unlabeled", str(unlabeled), "--ckpt_path", str(run), "--n", "4"], tmp_path) == 0
    out = capsys.readouterr()
    assert "Traceback" not in out.err
    assert "1 of the 12 files in --unlabeled are in the checkpoint's data set" in out.out
    assert "1 of 11 files could not be decoded and are not ranked: broken.png" in out.out
    columns, rows = read_csv(run / "suggest" / "to_label.csv")
    assert columns == FIELDS == ["image", "label", "suggested", "score", "rank"]
    assert [r["rank"] for r in rows] == ["1", "2", "3", "4"]
    assert all(r["label"] == "" and r["suggested"] in CLASSES and Path(r["image"]).is_file() for r in rows)
    assert len({r["image"] for r in rows}) == 4 and not any("broken" in r["image"] or "seen" in r["image"]
                                                            for r in rows)
    with Image.open(run / "suggest" / "to_label.png") as sheet:
        assert sheet.format == "PNG" and sheet.width > 200
    assert "--labels LABELS.csv" in out.out  # a run of class folders: no table to name

    # a label typed into to_label.csv, then suggest again: the file moved aside, whole, and said
    rows[1]["label"] = "circle"
    with open(run / "suggest" / "to_label.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=FIELDS)
        writer.writeheader()
        writer.writerows(rows)
    typed = (run / "suggest" / "to_label.csv").read_text()
    again = ["suggest", "--unlabeled", str(unlabeled), "--ckpt_path", str(run), "--n", "3"]
    assert cli(again, tmp_path) == 0
    said = capsys.readouterr().out
    assert f"held 1 filled labels the run's data does not hold yet: moved to {run / 'suggest'}" in said
    assert (run / "suggest" / "to_label.filled.csv").read_text() == typed and "--add" in said
    assert [r["label"] for r in read_csv(run / "suggest" / "to_label.csv")[1]] == ["", "", ""]
    # labels the run's data holds already (added and trained on): nothing lost, so written anew
    rows[1]["image"] = str(sorted((tiny_data / "train").rglob("*.png"))[3])
    with open(run / "suggest" / "to_label.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=FIELDS)
        writer.writeheader()
        writer.writerows(rows)
    assert cli(again, tmp_path) == 0
    assert [r["label"] for r in read_csv(run / "suggest" / "to_label.csv")[1]] == ["", "", ""]


def test_the_add_hint_names_the_run_s_table_and_its_data_dir(tmp_path):
    from project.extras.suggest.command import add_command, keep_filled_labels

    csv_path = tmp_path / "run" / "suggest" / "to_label.csv"
    table = tmp_path / "F" / "labels.csv"
    assert add_command(csv_path, None, str(tmp_path)).endswith("--labels LABELS.csv")
    assert add_command(csv_path, str(table), str(tmp_path / "F")).endswith(f"--labels {table}")
    assert add_command(csv_path, str(table), str(tmp_path / "F" / "mine")).endswith(
        f"--labels {table} --data_dir {tmp_path / 'F' / 'mine'}")
    # a filled to_label.csv: moved aside until the run's table (data_dir F/mine) holds it
    image = tmp_path / "F" / "mine" / "img" / "u1.png"
    csv_path.parent.mkdir(parents=True)
    write_csv([{"image": str(image), "suggested": "dots", "score": 0.1, "rank": 1}], csv_path)
    csv_path.write_text(csv_path.read_text().replace(",,dots", ",star,dots"))
    table.parent.mkdir(parents=True)
    table.write_text("image,label\nimg/u1.png,\n")
    typed = csv_path.read_text()
    for n, kept in enumerate(("to_label.filled.csv", "to_label.filled-2.csv")):
        keep_filled_labels(csv_path, set(), str(table), str(tmp_path / "F" / "mine"))
        assert (csv_path.parent / kept).read_text() == typed and not csv_path.exists(), n
        csv_path.write_text(typed)  # typed again; the earlier copy is kept
    table.write_text("image,label\nimg/u1.png,star\n")  # added (not trained on yet): nothing lost
    keep_filled_labels(csv_path, set(), str(table), str(tmp_path / "F" / "mine"))
    assert csv_path.exists()  # left to be written anew


def test_rank_images_gives_min_of_n_and_the_decodable_images_best_first(trained_run, unlabeled):
    from project.checkpoints import load_model

    model = load_model(best_ckpt(trained_run))
    paths = sorted(str(p) for p in unlabeled.rglob("*.png"))
    rows = rank_images(model, paths, "margin", n=100, batch_size=4)
    assert len(rows) == 10 and [r["rank"] for r in rows] == list(range(1, 11))
    assert [r["score"] for r in rows] == sorted(r["score"] for r in rows)  # smallest margin first
    assert set(rows[0]) == {"image", "suggested", "score", "rank"}
    assert len(rank_images(model, paths, "k-center", n=3, labeled_paths=paths[:2])) == 3


def test_add_appends_the_labeled_rows_to_a_table_the_reader_reads(tiny_data, tmp_path, capsys):
    data = tmp_path / "data"
    shutil.copytree(tiny_data / "train", data / "train")
    known = sorted((data / "train").rglob("*.png"))
    # the table: two labeled images and one listed without a label (an unlabeled image)
    (data / "labels.csv").write_text(f"image,label\n{known[0].relative_to(data).as_posix()},checker\n"
                                     f"{known[20].relative_to(data).as_posix()},dots\n"
                                     f"{known[30].relative_to(data).as_posix()},\n")
    new = data / "new"
    new.mkdir()
    outside = tmp_path / "elsewhere.png"
    for i in range(3):
        shutil.copy(known[i + 1], new / f"n{i}.png")
    shutil.copy(known[5], outside)
    images = [new / "n0.png", new / "n1.png", new / "n2.png", known[0], outside, known[30]]
    rows = [{"image": str(p), "suggested": "circle", "score": 0.1 * k, "rank": k + 1}
            for k, p in enumerate(images)]
    write_csv(rows, tmp_path / "to_label.csv")
    _, filled = read_csv(tmp_path / "to_label.csv")
    for row, label in zip(filled, ["circle", "star", "", "checker", "cross", "square"], strict=True):
        row["label"] = label
    with open(tmp_path / "to_label.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=FIELDS)
        writer.writeheader()
        writer.writerows(filled)

    args = ["suggest", "--add", str(tmp_path / "to_label.csv"), "--labels", str(data / "labels.csv")]
    assert cli(args, tmp_path) == 0
    out = capsys.readouterr().out
    assert "4 rows added" in out and "1 of them filled" in out and "1 skipped" in out
    assert "1 still without a label" in out and "Notice: star" in out
    table = read_table(data / "labels.csv", data)
    assert not table.problems, table.problems
    got = {row.image: row.label for row in table.rows}
    assert got["new/n0.png"] == "circle" and got["new/n1.png"] == "star"  # below the table: relative
    assert got[str(outside)] == "cross"  # outside it: absolute
    assert got[known[30].relative_to(data).as_posix()] == "square" and len(got) == 6
    assert "new/n2.png" not in got
    assert cli(args, tmp_path) == 0  # twice: nothing more
    assert "0 rows added" in capsys.readouterr().out and len(read_table(data / "labels.csv", data).rows) == 6

    # a table in F whose paths are relative to data.data_dir=F/mine, not to the table's folder
    folder = tmp_path / "F"
    (folder / "mine" / "img").mkdir(parents=True)
    for i in range(4):
        shutil.copy(known[i], folder / "mine" / "img" / f"u{i}.png")
    (folder / "labels.csv").write_text("image,label\nimg/u0.png,checker\nimg/u1.png,\nimg/u2.png,\n"
                                       "img/u3.png,\n")
    answers = [{"image": str(folder / "mine" / "img" / f"u{i}.png"), "suggested": "dots", "score": 0.1,
                "rank": i} for i in (1, 2)] + [{"image": str(new / "n0.png"), "suggested": "dots",
                                                "score": 0.2, "rank": 3}]
    write_csv(answers, tmp_path / "answers.csv")
    text = (tmp_path / "answers.csv").read_text().splitlines()
    text[1] = text[1].replace(",,dots", ",star,dots")  # u1 answered; u2 and n0 left empty
    (tmp_path / "answers.csv").write_text("\n".join(text) + "\n")
    for data_dir in ([], ["--data_dir", str(folder / "mine")]):  # found alone, or given
        assert cli(["suggest", "--add", str(tmp_path / "answers.csv"), "--labels", str(folder / "labels.csv"),
                    *data_dir], tmp_path) == 0
        out = capsys.readouterr().out
        table = read_table(folder / "labels.csv", folder / "mine", unlabeled_ok=True)
        assert not table.problems, table.problems
        assert {r.image: r.label for r in table.rows} == {"img/u0.png": "checker", "img/u1.png": "star"}
        assert sorted(table.unlabeled) == ["img/u2.png", "img/u3.png"]
        assert "3 still without a label" in out, out  # u2, u3 in the table; n0 in answers.csv
        assert ("1 rows added" if not data_dir else "0 rows added") in out, out

    fresh = tmp_path / "fresh" / "labels.csv"  # no table yet: made with its header
    assert cli(["suggest", "--add", str(tmp_path / "to_label.csv"), "--labels", str(fresh),
                "--data_dir", str(data)], tmp_path) == 0
    assert fresh.read_text().splitlines()[0] == "image,label"
    assert len(read_table(fresh, data).rows) == 5


def test_added_labels_are_split_as_training_splits_their_column(tmp_path):
    """A multi-label table that separates with ``;``: an answer of ``light blue`` alone is one
    label the table knows, not two new classes ``light`` and ``blue``."""
    from project.extras.suggest.labels import add_labels

    table = tmp_path / "labels.csv"
    table.write_text("image,labels\na.png,light blue;circle\nb.png,square\n")
    answers = tmp_path / "to_label.csv"
    answers.write_text(f"image,label,suggested\n{tmp_path / 'c.png'},light blue,square\n")  # suggest's
    for name in "abc":
        Image.new("RGB", (8, 8)).save(tmp_path / f"{name}.png")
    added = add_labels(answers, table)
    assert added.added == 1 and added.new_classes == []
    assert {r.image: r.label for r in read_table(table, tmp_path).rows}["c.png"] == ["light blue"]
    spaced = tmp_path / "spaced.csv"  # separated by spaces: an answer's ';' is written as a space
    spaced.write_text("image,labels\na.png,cat dog\nb.png,dog bird\n")
    answers.write_text(f"image,label,suggested\n{tmp_path / 'c.png'},cat;bird,cat\n")
    assert add_labels(answers, spaced).new_classes == []
    read = [r.label for r in read_table(spaced, tmp_path).rows]
    assert read == [["cat", "dog"], ["dog", "bird"], ["cat", "bird"]]
