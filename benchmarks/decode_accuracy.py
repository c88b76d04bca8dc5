"""Does decoding images reduced to the size the transforms need change accuracy?

    python -m benchmarks.decode_accuracy [--epochs 3] [--seeds 0 1 2] [--sets demo digits]
        [--preset scratch] [--sides 55 72]

Large images are decoded with their short side reduced to what the crops need
(``FolderDataModule.short_side``, by ``needed_side``); the transforms then make crops of the
same size as from the full image. This trains the template twice per seed on each set, once as
shipped and once with every image decoded at full size (and once per ``--sides`` value,
``data.decode_side``), and prints val accuracy side by side, with the per-seed difference to the full decode:

- ``demo``: the demo drawn at 192 px (``python -m project.data.demo --image-size 192``) and
  trained at 48 px (training decoded at 62 px), with the defaults of ``configs/train.yaml``;
- ``digits``: scikit-learn's handwritten digits (real, bundled) upscaled to 256 px and trained
  at 64 px (decoded at 77 px) with ``configs/presets/characters.yaml``;

resnet18 from random weights; ``--preset`` stacks presets on both (e.g. ``scratch``).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

from benchmarks.accuracy import REPO, mean_sd, table, template_run, write_digits

FULL = ("-m", "benchmarks.decode_accuracy", "--full-decode")


def full_decode_cli(argv: list[str]) -> int:
    """``python -m project`` with every image decoded at full size (the behaviour before)."""
    from project.cli import main
    from project.data.datamodule import FolderDataModule

    FolderDataModule.short_side = lambda self, split: None
    return main(argv)


def demo_192(folder: Path) -> Path:
    """The demo drawn at 192 px, 300 training images per class."""
    from project.data.demo import main as make_demo

    if make_demo([str(folder), "--image-size", "192", "--train-per-class", "300"]) != 0:
        raise RuntimeError("could not make the demo data")
    return folder


def preset_data_settings(presets: tuple[str, ...]) -> dict:
    """The ``data:`` settings the presets stack (a later one wins), for the sides the runs use."""
    import yaml

    settings: dict = {}
    for name in presets:
        config = yaml.safe_load((REPO / f"configs/presets/{name}.yaml").read_text()) or {}
        settings |= config.get("data") or {}
    return settings


def paired(values: list[float], full: list[float]) -> str:
    """Mean and sd of the per-seed differences to the full decode: a seed fixes the initial
    weights, the batch order and the augmentation draws, so a pair differs only by the decode."""
    diffs = [100 * (v - f) for v, f in zip(values, full, strict=True)]
    sd = f" ± {statistics.stdev(diffs):.1f}" if len(diffs) > 1 else ""
    return f"{statistics.mean(diffs):+.1f}{sd} points"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--full-decode"]:
        return full_decode_cli(argv[1:])
    p = argparse.ArgumentParser(prog="python -m benchmarks.decode_accuracy",
                                description=__doc__.split("\n")[0])
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--sets", nargs="+", choices=["demo", "digits"], default=["demo", "digits"])
    p.add_argument("--preset", nargs="*", default=[], help="presets stacked on both sets")
    p.add_argument("--sides", type=int, nargs="*", default=[], help="data.decode_side values to add")
    a = p.parse_args(argv)
    from project.common.preprocessing import Preprocessing
    from project.data import FolderDataModule

    with tempfile.TemporaryDirectory(prefix="decode-") as tmp:
        tmp = Path(tmp)
        sets = {  # name: (make the data, training image size, presets)
            "demo": (lambda: demo_192(tmp / "demo"), 48, ()),
            "digits": (lambda: write_digits(tmp / "digits", 256), 64, ("characters",)),
        }
        rows = []
        for name in a.sets:
            make, size, presets = sets[name]
            presets = (*presets, *a.preset)
            data = make()
            dm = FolderDataModule(data, **preset_data_settings(presets))
            dm.preprocessing = Preprocessing(size)
            variants = {"full size": (FULL, []),
                        f"reduced to {dm.short_side('train')} (default)": (("-m", "project"), []),
                        **{f"reduced to {n}": (("-m", "project"), [f"--data.decode_side={n}"])
                           for n in a.sides}}
            full: list[float] = []
            for decode, (launcher, extra) in variants.items():
                finals, walls = [], []
                for seed in a.seeds:
                    h, _ = template_run(data, size, a.epochs, seed, tmp / f"{name}-{len(rows)}-{seed}",
                                        *extra, presets=presets, launcher=launcher)
                    finals.append(h[-1][1])
                    walls.append(h[-1][0])
                if decode == "full size":  # the first variant: the others are paired with it
                    full = finals
                eval_side = dm.short_side("val") if decode != "full size" else "full"
                rows.append([name, size, decode, eval_side, mean_sd(finals),
                             paired(finals, full) if finals is not full else "",
                             f"{statistics.mean(walls):.0f} s"])
                print(rows[-1], flush=True)
        print(f"\n{a.epochs} epochs, resnet18 from random weights, seeds {a.seeds}, presets {a.preset}\n")
        print(table(["data", "image_size", "training decode", "evaluation decode", "val acc",
                     "minus full, same seed", "wall"], rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
