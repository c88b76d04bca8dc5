"""Does decoding images reduced to the size the transforms need change accuracy?

    python -m benchmarks.decode_accuracy [--epochs 3] [--seeds 0 1 2]

Large images are decoded with their short side reduced to what the crops need
(``project.data.images.decode_side``); the transforms then make crops of the same size as from
the full image. This trains the template twice per seed on each set, once as shipped and once
with every image decoded at full size, and prints val accuracy side by side:

- the demo drawn at 192 px (``python -m project.data.demo --image-size 192``) and trained at
  48 px (decoded at 55 px), with the defaults of ``configs/train.yaml``;
- scikit-learn's handwritten digits (real, bundled) upscaled to 256 px and trained at 64 px
  (decoded at 73 px) with ``configs/presets/characters.yaml``; resnet18 from random weights.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

from benchmarks.accuracy import mean_sd, table, template_run, write_digits

FULL = ("-m", "benchmarks.decode_accuracy", "--full-decode")


def full_decode_cli(argv: list[str]) -> int:
    """``python -m project`` with every image decoded at full size (the behaviour before)."""
    from project.cli import main
    from project.data.datamodule import FolderDataModule

    FolderDataModule.decode_side = lambda self, split: None
    return main(argv)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--full-decode"]:
        return full_decode_cli(argv[1:])
    p = argparse.ArgumentParser(prog="python -m benchmarks.decode_accuracy",
                                description=__doc__.split("\n")[0])
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    a = p.parse_args(argv)
    from project.data import FolderDataModule
    from project.data.demo import main as make_demo

    with tempfile.TemporaryDirectory(prefix="decode-") as tmp:
        tmp = Path(tmp)
        make_demo([str(tmp / "demo"), "--image-size", "192", "--train-per-class", "300"])
        sets = {  # name: (data, training image size, presets)
            "demo, 192 px images": (tmp / "demo", 48, ()),
            "digits, 256 px images": (write_digits(tmp / "digits", 256), 64, ("characters",)),
        }
        rows = []
        for name, (data, size, presets) in sets.items():
            dm = FolderDataModule(data, image_size=size)
            if "characters" in presets:
                dm = FolderDataModule(data, image_size=size, crop_scale=(0.7, 1.0))
            sides = f"{dm.decode_side('train')} / {dm.decode_side('val')}"
            for decode, launcher in (("reduced (default)", ("-m", "project")), ("full size", FULL)):
                finals, walls = [], []
                for seed in a.seeds:
                    h, _ = template_run(data, size, a.epochs, seed, tmp / f"{name[:5]}-{decode[:4]}-{seed}",
                                        presets=presets, launcher=launcher)
                    finals.append(h[-1][1])
                    walls.append(h[-1][0])
                rows.append([name, size, decode, sides if decode.startswith("reduced") else "full",
                             mean_sd(finals), f"{statistics.mean(walls):.0f} s"])
                print(rows[-1], flush=True)
        print(f"\n{a.epochs} epochs, resnet18 from random weights, seeds {a.seeds}\n")
        print(table(["data", "image_size", "decode", "decoded short side (train / eval)", "val acc",
                     "wall"], rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
