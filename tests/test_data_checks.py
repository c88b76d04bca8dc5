"""Callbacks that check the data: the bad-image count under DDP, the first-batch input check."""

from __future__ import annotations

import inspect
import json
import logging
import socket
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from project.callbacks import badimages
from project.callbacks.badimages import BadImageReport, gather_skipped, merge_skipped
from project.callbacks.guards import InputCheck
from project.callbacks.plots import image_grid_figure


class _Module:
    """Just enough of a LightningModule for a callback hook: records what it logs."""

    def __init__(self) -> None:
        self.logged: dict[str, float] = {}
        self.device = torch.device("cpu")

    def log(self, name: str, value: float, **kwargs) -> None:
        self.logged[name] = value


def test_merge_skipped_counts_a_file_flagged_by_two_ranks_once():
    per_rank = [["val/a.png", "train/b.png"], ["train/b.png", "train/c.png"], []]
    assert merge_skipped(per_rank) == ["train/b.png", "train/c.png", "val/a.png"]
    assert merge_skipped([[], []]) == []
    assert gather_skipped(["x.png"]) == [["x.png"]]  # one process: nothing to gather


def test_bad_image_report_logs_the_union_of_the_ranks(monkeypatch, caplog):
    """Two ranks both flagged b.png: 2 unique files, where adding the counts up said 3."""
    flagged = {"train": ["a.png", "b.png"]}
    dataset = SimpleNamespace(skipped_paths=lambda: flagged["train"])
    trainer = SimpleNamespace(datamodule=SimpleNamespace(datasets={"train": dataset}),
                              is_global_zero=True)
    monkeypatch.setattr(badimages, "gather_skipped", lambda local: [local, ["b.png"]])
    module = _Module()
    with caplog.at_level(logging.WARNING, logger="project"):
        BadImageReport().on_train_epoch_end(trainer, module)
    assert module.logged["data/skipped_images"] == 2.0
    assert "Skipped 2 undecodable image(s)" in caplog.text


def _gather_on_rank(rank: int, port: int, out: str) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        mine = [["shared.png", "only0.png"], ["shared.png"]][rank]
        Path(out, f"{rank}.json").write_text(json.dumps(merge_skipped(gather_skipped(mine))))
    finally:
        dist.destroy_process_group()


def test_gather_skipped_is_a_real_collective_over_two_processes(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_gather_on_rank, args=(port, str(tmp_path)), nprocs=2, join=True)
    for rank in (0, 1):  # every rank gets the same union
        assert json.loads((tmp_path / f"{rank}.json").read_text()) == ["only0.png", "shared.png"]


def test_input_check_survives_a_batch_without_any_finite_value(caplog):
    batch = (torch.full((2, 3, 4, 4), float("nan")), torch.zeros(2, dtype=torch.long))
    module = _Module()
    with caplog.at_level(logging.INFO, logger="project"):
        InputCheck().on_train_batch_start(None, module, batch, 0)
    assert "contain 96 NaN/Inf values" in caplog.text
    assert "un-normalised" not in caplog.text  # no finite value to call un-normalised
    assert "input/mean/c0" in module.logged


def test_image_grid_takes_normalised_images_only():
    assert list(inspect.signature(image_grid_figure).parameters) == ["images", "labels", "title"]
    fig = image_grid_figure(torch.zeros(2, 3, 8, 8), ["a", "b"], "grid")
    assert [ax.get_title() for ax in fig.axes[:2]] == ["a", "b"]
