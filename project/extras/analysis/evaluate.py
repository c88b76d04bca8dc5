"""``python -m project evaluate [CKPT_OR_RUN_DIR|best|last] [--tta hflip] [overrides]``.

Tests a checkpoint with its run's own config (the metrics synced across DDP ranks, logged into
the run's TensorBoard as ``test/...``), then writes the report next to the checkpoint from one
per-image pass over the test set (``report.py``). The score stands alone from the run that made
the checkpoint: whatever its config limited (the debug preset's ``limit_test_batches``,
``fast_dev_run``, ...), the whole test split is scored, in float32 (``32-true``) unless the
command line says otherwise. A checkpoint without a temperature gets one first, fitted on the
validation set and stored beside it (``calibration.py``), so the report's confidences, and
predict's and export's from then on, are calibrated; the checkpoint file is never rewritten.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from project.checkpoints import apply_calibration, check_trained_data_dir, checkpoint_task, read_checkpoint
from project.cli import ProjectCLI
from project.common.argv import glue_values, pop_option
from project.common.files import write_text
from project.errors import ProjectError
from project.extras.analysis.calibration import ensure_temperature
from project.extras.analysis.predictions import check_mirror_tta, predict_dataset
from project.runs import resolve_checkpoint, run_config

# What a run's config may hold to shorten its loops (configs/presets/debug.yaml, a quick check);
# put back so that nothing limits the test loop. 1.0, not 1: Lightning reads an int 1 as one batch.
WHOLE_TEST_SPLIT = ("--trainer.limit_test_batches=1.0", "--trainer.limit_val_batches=1.0",
                    "--trainer.fast_dev_run=false", "--trainer.overfit_batches=0.0",
                    "--data.unlabeled=null")  # FixMatch's images: training's alone (they may be gone)
# The reference number: the per-image pass of the report is float32 too, so the two agree.
EVAL_PRECISION = "--trainer.precision=32-true"


class EvaluateCLI(ProjectCLI):
    """The test run of ``evaluate``: says what it scores before it starts."""

    def before_test(self) -> None:
        if self.trainer.is_global_zero:
            ckpt, images = self.config[self.subcommand].get("ckpt_path"), count_test_images(self.datamodule)
            print(f"Evaluating {ckpt} on {images} test images in {self.trainer.precision}", flush=True)


def count_test_images(dm) -> int:
    """The number of images in the test split, read from the listing (nothing decoded yet)."""
    if dm.streaming:
        return int(dm.streamed.manifest["splits"].get("test", {}).get("size") or 0)
    return len(dm.splits.test)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(
        prog="python -m project evaluate", usage="%(prog)s [CKPT|RUN_DIR|best|last] [--tta none|hflip] "
        "[--top N] [--target_acc P] [--key=value ...]",
        description="Test a checkpoint with its run's own config (--key=value overrides it, e.g. "
                    "--trainer.accelerator=cpu) and write report.md, mistakes.csv and plots beside it.")
    p.add_argument("checkpoint", nargs="?", default=None, help="a .ckpt, a run folder, best or last")
    p.add_argument("--tta", default="none", choices=("none", "hflip"),
                   help="hflip: also report the mean of each image's and its mirror's probabilities")
    p.add_argument("--top", type=int, default=24, help="images in top_losses.png")
    p.add_argument("--target_acc", type=float, default=0.99,
                   help="the accuracy on answered images that the abstain threshold reaches")
    a, overrides = p.parse_known_args(glue_values(argv, {"--tta", "--top", "--target_acc", "--help"}))
    ckpt = resolve_checkpoint(a.checkpoint).resolve()  # from inside checkpoints/, or a link: the file's place
    run = ckpt.parent.parent
    trained = read_checkpoint(ckpt, mmap=True).get("datamodule_hyper_parameters") or {}
    if a.tta == "hflip":
        check_mirror_tta(trained)
    data_dir = pop_option(list(overrides), "--data.data_dir")[1]  # the run's folder, moved
    if trained.get("data_dir") and not data_dir:
        check_trained_data_dir(ckpt, str(trained["data_dir"]), "--data.data_dir=")
    if ckpt.parent.name != "checkpoints" or not (run / "config.yaml").is_file():
        raise ProjectError(f"'{ckpt}' is not where training wrote it (RUN/checkpoints/, beside "
                           "RUN/config.yaml), so the run's settings are unknown: evaluate it in its run "
                           "folder, or copy the whole run folder")
    calibrated = checkpoint_task(ckpt).temperature_scaling
    if int(os.environ.get("RANK", 0)) == 0 and calibrated:  # under torchrun every rank runs it
        ensure_temperature(ckpt, data_dir)
    # the user's overrides come last, so they win over both the run's config and ours
    args = ["test", "--config", str(run_config(run)), f"--ckpt_path={ckpt}", "--verbose=false"]
    cli = EvaluateCLI(args=[*args, *WHOLE_TEST_SPLIT, EVAL_PRECISION, *overrides], run_dir=run)
    if not cli.trainer.is_global_zero:
        return 0
    model, dm = cli.model, cli.datamodule
    apply_calibration(model, ckpt)  # Lightning loaded the weights alone; T lives beside them
    samples = predict_dataset(model, dm.datasets["test"], dm.batch_size, model.device,
                              mirrored=a.tta == "hflip")
    out_dir = Path(ckpt).parent
    before = modified_times(out_dir)
    model.task.write_report(model, model.results["test"], str(ckpt), out_dir, samples,
                            dm.datasets["test"], a.top, a.target_acc)
    skipped = dm.datasets["test"].skipped_paths() if hasattr(dm.datasets["test"], "skipped_paths") else []
    if skipped:
        print(f"Notice: {len(skipped)} test images could not be decoded and are not scored "
              f"(first: {skipped[0]}; python -m project check-data lists them)")
    add_probe(run / "probe.json", out_dir / "report.md", ckpt)
    written = sorted(name for name, when in modified_times(out_dir).items() if before.get(name) != when)
    others = [name for name in written if name != "report.md"]
    print(f"\nReport: {out_dir / 'report.md'}" + (f" (and {', '.join(others)})" if others else ""))
    return 0


def modified_times(folder: Path) -> dict[str, int]:
    """Each file's modification time: what a task's report wrote is listed for every task alike."""
    return {p.name: p.stat().st_mtime_ns for p in folder.iterdir() if p.is_file()} if folder.is_dir() else {}


def add_probe(probe: Path, report: Path, ckpt: Path) -> None:
    """The linear probe's scores (``python -m project probe`` of this checkpoint, when it ran)
    beside the fine-tuned model's, at the end of the report: what fine-tuning earned over the
    frozen features."""
    if not probe.is_file() or not report.is_file():
        return
    import json

    scores = json.loads(probe.read_text(encoding="utf-8"))
    if scores.get("checkpoint") != ckpt.name:  # another checkpoint's fine-tuned scores
        return
    lines = ["", "## Linear probe", "", "A linear classifier on the frozen embeddings of "
             f"{scores.get('network')} (`python -m project probe`), beside this model:", "",
             f"| split | probe {scores.get('metric', 'acc')} | fine-tuned |", "|---|---|---|"]
    metric = scores.get("metric", "acc")
    for split in ("val", "test"):
        probe_acc, tuned = scores.get(f"{split}_{metric}_probe"), scores.get(f"{split}_{metric}_finetuned")
        if probe_acc is not None:
            lines.append(f"| {split} | {probe_acc:.4f} | {'-' if tuned is None else f'{tuned:.4f}'} |")
    write_text(report, report.read_text(encoding="utf-8") + "\n".join(lines) + "\n")
    print("\n".join(lines[1:2] + lines[5:]))
