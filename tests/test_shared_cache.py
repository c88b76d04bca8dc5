"""The decoded-image cache under DDP: decoded once per node, mapped by every rank, same pixels."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from project.data import shared_cache as shared
from project.data.demo import make_demo
from project.data.images import ImageCache

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def data_with_bad_file(tmp_path_factory) -> Path:
    data = make_demo(tmp_path_factory.mktemp("data") / "set", train_per_class=6, val_per_class=3,
                     test_per_class=1, image_size=40, num_classes=2, seed=2)
    broken = next((data / "train").iterdir()) / "broken.png"
    broken.write_bytes(b"not an image")
    return data


def test_shared_cache_holds_the_in_memory_pixels_and_leaves_no_file(data_with_bad_file, monkeypatch,
                                                                      tmp_path):
    monkeypatch.setattr(shared, "_folders", lambda: [tmp_path])
    paths = sorted(str(p) for p in (data_with_bad_file / "train").rglob("*.png"))
    barriers = []
    mapped = shared.shared_cache(paths, 36, "train-36", 0, lambda: barriers.append(1))
    memory = ImageCache.decode(paths, short_side=36, threads=2)
    assert len(barriers) == 2  # one before mapping, one before unlinking
    broken = paths.index(str(next(data_with_bad_file.rglob("broken.png"))))
    assert mapped[broken] is None and memory[broken] is None
    assert torch.equal(mapped.buffer, memory.buffer)
    for i in range(len(paths)):
        a, b = mapped[i], memory[i]
        assert (a is None and b is None) or torch.equal(a, b)
    assert list(tmp_path.iterdir()) == []  # unlinked once mapped: the mapping keeps the pixels


RANK_SCRIPT = """
import hashlib, json, sys
from pathlib import Path

import lightning as L
import torch

import project.data.images as images
from project.common.preprocessing import Preprocessing
from project.data import FolderDataModule

decodes = []
_decode = images.try_decode


def counting_decode(path, short_side=None):
    decodes.append(path)
    return _decode(path, short_side)


images.try_decode = counting_decode


class Probe(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(3, 2)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.cross_entropy(self.layer(x.float().mean((2, 3))), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def on_train_start(self):
        report = {"decodes": len(decodes), "caches": {}}
        for split, dataset in self.trainer.datamodule.datasets.items():
            cache = dataset.cache
            report["caches"][split] = {"sha": hashlib.sha256(cache.buffer.numpy().tobytes()).hexdigest(),
                                       "len": len(cache),
                                       "bad": [i for i in range(len(cache)) if cache[i] is None]}
        Path(sys.argv[2], f"rank{self.global_rank}.json").write_text(json.dumps(report))


dm = FolderDataModule(sys.argv[1], batch_size=4, num_workers=0, cache="memory")
dm.preprocessing = Preprocessing(32)
trainer = L.Trainer(accelerator="cpu", devices=2, strategy="ddp", max_steps=1, logger=False,
                    enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                    limit_val_batches=0, num_sanity_val_steps=0)
trainer.fit(Probe(), dm)
# as the CLI does: a gloo group left open can abort the process at exit
torch.distributed.destroy_process_group()
"""


@pytest.mark.distributed
def test_two_ranks_decode_once_and_see_the_same_pixels(data_with_bad_file, tmp_path):
    script = tmp_path / "ranks.py"
    script.write_text(textwrap.dedent(RANK_SCRIPT))
    result = subprocess.run([sys.executable, str(script), str(data_with_bad_file), str(tmp_path)], cwd=REPO,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    reports = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    images_in_splits = sum(c["len"] for c in reports[0]["caches"].values())
    assert images_in_splits == 2 * 6 + 1 + 2 * 3  # train (with the broken file) and val
    assert reports[0]["decodes"] == images_in_splits  # every image decoded once, by local rank 0...
    assert reports[1]["decodes"] == 0  # ...and never by the other rank
    assert reports[0]["caches"] == reports[1]["caches"]  # identical pixels, and the same bad file
    assert len(reports[0]["caches"]["train"]["bad"]) == 1
