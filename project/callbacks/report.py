"""The test report: a per-class table on the console and report.{json,md} + confusion matrix PNG.

Written next to the checkpoint that was evaluated, so each model file keeps its own report.
"""

from __future__ import annotations

import json
from pathlib import Path

import lightning as L
from lightning.pytorch.callbacks import Callback

from project.callbacks.plots import confusion_figure, save
from project.common.files import write_text
from project.model.metrics import confused_pairs, per_class_table


def format_table(table: dict) -> str:
    """Plain-text table in the layout of scikit-learn's classification_report."""
    width = max(12, *(len(n) for n in table["classes"]))

    def row(name: str, r: dict) -> str:
        return (f"{name:>{width}}  {r['precision']:9.4f}  {r['recall']:9.4f}  {r['f1']:9.4f}  "
                f"{r['support']:8d}")

    total = table["averages"]["macro avg"]["support"]
    lines = [f"{'':>{width}}  {'precision':>9}  {'recall':>9}  {'f1':>9}  {'support':>8}", ""]
    lines += [row(name, r) for name, r in table["classes"].items()]
    lines += ["", f"{'accuracy':>{width}}  {'':9}  {'':9}  {table['accuracy']:9.4f}  {total:8d}"]
    lines += [row(name, r) for name, r in table["averages"].items()]
    return "\n".join(lines)


def format_markdown(table: dict, pairs: list[dict], checkpoint: str) -> str:
    lines = [f"# Test report\n\nCheckpoint: `{checkpoint}`\n",
             f"Accuracy: **{table['accuracy']:.4f}**\n",
             "| class | precision | recall | f1 | support |", "|---|---|---|---|---|"]
    for name, r in list(table["classes"].items()) + list(table["averages"].items()):
        lines.append(f"| {name} | {r['precision']:.4f} | {r['recall']:.4f} | {r['f1']:.4f} | "
                     f"{r['support']} |")
    lines += ["", "## Most confused pairs", "", "| true | predicted as | count | share |",
              "|---|---|---|---|"]
    lines += [f"| {p['true']} | {p['predicted']} | {p['count']} | {p['share_of_true']:.1%} |"
              for p in pairs]
    lines += ["", "![confusion matrix](confusion_matrix.png)", ""]
    return "\n".join(lines)


def write_report(result: dict, class_names: list[str], checkpoint: str, out_dir: Path,
                 tta: tuple[str, dict] | None = None) -> dict:
    """Print the table and write the three files; returns the report as a dict. ``tta``:
    (policy, test-time-augmentation results), reported beside the plain numbers."""
    table = per_class_table(result, "test", class_names)
    confusion = result["test/confusion"]
    pairs = confused_pairs(confusion, class_names)
    report = {
        "checkpoint": checkpoint,
        **table,
        "loss": float(result["test/loss"]),
        "nll": float(result["test/nll"]),
        "acc_macro": float(result["test/acc_macro"]),
        "f1_macro": float(result["test/f1_macro"]),
        "confusion_matrix": confusion.tolist(),
        "class_names": class_names,
        "confused_pairs": pairs,
    }
    markdown = format_markdown(table, pairs, checkpoint)
    tta_line = None
    if tta is not None:
        tta_line = add_tta(report, *tta)
        markdown += f"\n{tta_line}\n"
    out_dir.mkdir(parents=True, exist_ok=True)
    write_text(out_dir / "report.json", json.dumps(report, indent=2))
    write_text(out_dir / "report.md", markdown)
    save(confusion_figure(confusion, class_names, "test confusion matrix"),
         out_dir / "confusion_matrix.png")
    print("\n" + format_table(table))
    if pairs:
        print("\nMost confused (true -> predicted): " + ", ".join(
            f"{p['true']} -> {p['predicted']} ({p['count']})" for p in pairs))
    print(f"\nReport: {out_dir / 'report.md'} (and report.json, confusion_matrix.png)")
    if tta_line:
        print(tta_line)
    return report


def add_tta(report: dict, policy: str, tta: dict) -> str:
    """Add test-time augmentation's numbers to ``report``; returns the line comparing them."""
    report["tta"] = {"policy": policy, "accuracy": float(tta["test_tta/acc"]),
                     "f1_macro": float(tta["test_tta/f1_macro"]), "loss": float(tta["test_tta/loss"])}
    line = (f"Test-time augmentation ({policy}): accuracy {report['tta']['accuracy']:.4f} "
            f"(plain {report['accuracy']:.4f}), macro F1 {report['tta']['f1_macro']:.4f} "
            f"(plain {report['f1_macro']:.4f})")
    return line


class TestReport(Callback):
    """After ``test``: print the per-class table and write the report files."""

    def on_test_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        ckpt = trainer.ckpt_path
        out_dir = Path(ckpt).parent if ckpt else Path(trainer.log_dir or ".")  # log_dir: collective
        result = getattr(pl_module, "results", {}).get("test")
        if result is None or not trainer.is_global_zero:
            return
        tta = pl_module.results.get("test_tta")
        write_report(result, pl_module.class_names, str(ckpt or "(in-memory model)"), out_dir,
                     (pl_module.hparams.tta, tta) if tta is not None else None)
