"""Callbacks that tests add to a run in another process (``--trainer.callbacks+=tests.probes.X``)."""

import json
from pathlib import Path

from lightning.pytorch.callbacks import Callback


class RecordUnlabeled(Callback):
    """Writes the unlabeled indices each rank draws each epoch to ``out/rank<r>-epoch<e>.json``."""

    def __init__(self, out: str) -> None:
        self.out = Path(out)

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        sampler = trainer.train_dataloader["unlabeled"].sampler  # the loaders as train_dataloader gave them
        self.out.mkdir(parents=True, exist_ok=True)
        name = f"rank{trainer.global_rank}-epoch{trainer.current_epoch}.json"
        (self.out / name).write_text(json.dumps([index for index, _ in sampler]))
