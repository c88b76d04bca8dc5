"""The test report: a per-class table on the console, report.{json,md} and its pictures.

Written next to the checkpoint that was evaluated, so each model file keeps its own report:
report.md (summary, per-class table with average precision, confusion matrix, most confused
pairs, top losses, calibration), report.json, confusion_matrix.png, pr_curves.png,
top_losses.png, reliability.png and mistakes.csv (every misclassified test image).
"""

from __future__ import annotations

import json
from pathlib import Path

import lightning as L
from lightning.pytorch.callbacks import Callback

from project.callbacks.mistakes import mistakes, sample_rows, top_losses_figure, write_mistakes_csv
from project.callbacks.plots import confusion_figure, curves_figure, reliability_figure, save
from project.common.files import write_text
from project.data.transforms import IMAGENET_MEAN, IMAGENET_STD
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


def _summary(report: dict) -> list[str]:
    lines = ["## Summary", "", "| | |", "|---|---|",
             f"| images | {report['images']} |",
             f"| accuracy | **{report['accuracy']:.4f}** |",
             f"| balanced accuracy (macro recall) | {report['acc_macro']:.4f} |",
             f"| macro F1 | {report['f1_macro']:.4f} |"]
    if report.get("ap_macro") is not None:
        lines.append(f"| mean average precision | {report['ap_macro']:.4f} |")
    if report.get("auroc") is not None:
        lines.append(f"| AUROC | {report['auroc']:.4f} |")
    cal = report.get("calibration")
    lines.append(f"| NLL | {report['nll']:.4f} |")
    if cal and cal["temperature"] != 1.0:
        lines.append(f"| ECE (temperature {cal['temperature']:.3f}) | {cal['ece_after']:.4f} "
                     f"(raw softmax {cal['ece_before']:.4f}) |")
    elif report.get("ece") is not None:
        lines.append(f"| ECE | {report['ece']:.4f} |")
    if report.get("mistakes") is not None:
        lines.append(f"| misclassified | {report['mistakes']} (`mistakes.csv`) |")
    return lines


def format_markdown(table: dict, pairs: list[dict], checkpoint: str, report: dict | None = None,
                    files: set[str] = frozenset()) -> str:
    """report.md: summary, per-class table, confusion matrix, most confused pairs, top losses,
    calibration; each picture referenced by its file name (they sit next to it)."""
    report = report or {"images": sum(r["support"] for r in table["classes"].values()),
                        "accuracy": table["accuracy"], "acc_macro": float("nan"),
                        "f1_macro": table["averages"]["macro avg"]["f1"], "nll": float("nan")}
    lines = [f"# Test report\n\nCheckpoint: `{checkpoint}`\n", *_summary(report), ""]
    has_ap = "ap" in next(iter(table["classes"].values()))
    ap_head, ap_rule = (" AP |", "---|") if has_ap else ("", "")
    lines += ["## Per-class results", "", f"| class | precision | recall | f1 |{ap_head} support |",
              f"|---|---|---|---|{ap_rule}---|"]
    for name, r in list(table["classes"].items()) + list(table["averages"].items()):
        ap = f" {r['ap']:.4f} |" if has_ap else ""
        lines.append(f"| {name} | {r['precision']:.4f} | {r['recall']:.4f} | {r['f1']:.4f} |{ap} "
                     f"{r['support']} |")
    if "pr_curves.png" in files:
        what = "Precision-recall per class and ROC" if report.get("auroc") is not None else \
            "Precision-recall per class"
        lines += ["", f"{what} (average precision in the legend):", "",
                  "![precision-recall curves](pr_curves.png)"]
    lines += ["", "## Confusion matrix", "", "Rows: true class; colour: share of the true class.",
              "", "![confusion matrix](confusion_matrix.png)", "",
              "## Most confused pairs", "", "| true | predicted as | count | share |",
              "|---|---|---|---|"]
    lines += [f"| {p['true']} | {p['predicted']} | {p['count']} | {p['share_of_true']:.1%} |"
              for p in pairs]
    if not pairs:
        lines.append("| - | - | 0 | - |")
    top = report.get("top_losses")
    if top is not None:
        lines += ["", "## Top losses", "", "The test images the model is most wrong about (red: "
                  "misclassified), titled true / predicted / probability. Every misclassified "
                  "image is in `mistakes.csv`, highest loss first.", ""]
        if "top_losses.png" in files:
            lines += ["![top losses](top_losses.png)", ""]
        lines += ["| image | true | predicted | probability | loss | runner-up |",
                  "|---|---|---|---|---|---|"]
        lines += [f"| `{r['path']}` | {r['true']} | {r['predicted']} | {r['probability']:.3f} | "
                  f"{r['loss']:.3f} | {r['runner_up']} ({r['runner_up_probability']:.3f}) |"
                  for r in top]
    cal = report.get("calibration")
    if cal is not None:
        fitted = cal["temperature"] != 1.0
        lines += ["", "## Calibration", "",
                  "Expected calibration error (ECE, 15 bins): the average gap between confidence "
                  "and accuracy. " + (f"Temperature {cal['temperature']:.4f}, fitted on the "
                                      "validation set, divides the logits before the softmax." if fitted
                                      else "No temperature was fitted (`python -m project calibrate`)."),
                  "", "| | raw softmax | with temperature |", "|---|---|---|",
                  f"| NLL | {cal['nll_before']:.4f} | {cal['nll_after']:.4f} |",
                  f"| ECE | {cal['ece_before']:.4f} | {cal['ece_after']:.4f} |"]
        if "reliability.png" in files:
            lines += ["", "![reliability diagram](reliability.png)"]
    lines.append("")
    return "\n".join(lines)


def write_report(result: dict, class_names: list[str], checkpoint: str, out_dir: Path,
                 tta: tuple[str, dict] | None = None, samples: dict | None = None,
                 dataset: object = None, temperature: float = 1.0, mean=None, std=None,
                 top: int = 24) -> dict:
    """Print the table and write the report files; returns the report as a dict. ``tta``:
    (policy, test-time-augmentation results), reported beside the plain numbers. ``samples``:
    each test image's logits (``ImageClassifier.samples["test"]``), for top losses,
    mistakes.csv, curves and calibration; ``dataset`` gives their files and pixels."""
    table = per_class_table(result, "test", class_names)
    confusion = result["test/confusion"]
    pairs = confused_pairs(confusion, class_names)
    report = {
        "checkpoint": checkpoint,
        **table,
        "images": int(confusion.sum()),
        "loss": float(result["test/loss"]),
        "nll": float(result["test/nll"]),
        "acc_macro": float(result["test/acc_macro"]),
        "f1_macro": float(result["test/f1_macro"]),
        "ece": _maybe(result, "test/ece"),
        "ap_macro": _maybe(result, "test/ap_macro"),
        "auroc": _maybe(result, "test/auroc"),
        "confusion_matrix": confusion.tolist(),
        "class_names": class_names,
        "confused_pairs": pairs,
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    save(confusion_figure(confusion, class_names, "test confusion matrix"),
         out_dir / "confusion_matrix.png")
    files = {"confusion_matrix.png"}
    if samples is not None and len(samples["target"]):
        files |= _per_image(report, samples, class_names, dataset, temperature, mean, std, top,
                            out_dir)
    markdown = format_markdown(table, pairs, checkpoint, report, files)
    tta_line = None
    if tta is not None:
        tta_line = add_tta(report, *tta)
        markdown += f"\n{tta_line}\n"
    write_text(out_dir / "report.json", json.dumps(report, indent=2))
    write_text(out_dir / "report.md", markdown)
    print("\n" + format_table(table))
    if pairs:
        print("\nMost confused (true -> predicted): " + ", ".join(
            f"{p['true']} -> {p['predicted']} ({p['count']})" for p in pairs))
    cal = report.get("calibration")
    if cal:
        print(f"\nCalibration: ECE {cal['ece_before']:.4f} (raw softmax) -> {cal['ece_after']:.4f} "
              f"(temperature {cal['temperature']:.4f}); NLL {cal['nll_before']:.4f} -> "
              f"{cal['nll_after']:.4f}")
    print(f"\nReport: {out_dir / 'report.md'} (and {', '.join(sorted(files | {'report.json'}))})")
    if tta_line:
        print(tta_line)
    return report


def _maybe(result: dict, key: str) -> float | None:
    return float(result[key]) if key in result else None


def _per_image(report: dict, samples: dict, class_names: list[str], dataset: object,
               temperature: float, mean, std, top: int, out_dir: Path) -> set[str]:
    """Top losses, mistakes.csv, PR curves and calibration from each image's logits; adds
    their numbers to ``report`` and returns the files written."""
    from project.model.calibration import calibration_numbers

    rows = sample_rows(samples, class_names, temperature, dataset)
    write_mistakes_csv(rows, out_dir / "mistakes.csv")
    files = {"mistakes.csv", "pr_curves.png", "reliability.png"}
    report["mistakes"] = len(mistakes(rows))
    report["top_losses"] = [{k: r[k] for k in ("path", "true", "predicted", "probability", "loss",
                                               "runner_up", "runner_up_probability")}
                            for r in rows[:10]]
    fig = top_losses_figure(rows, dataset, mean or IMAGENET_MEAN, std or IMAGENET_STD,
                            "test top losses", top)
    if fig is not None:
        save(fig, out_dir / "top_losses.png")
        files.add("top_losses.png")
    logits, target = samples["logits"], samples["target"]
    report["calibration"] = calibration_numbers(logits, target, temperature)
    save(reliability_figure(logits, target, temperature, title="test reliability diagram"),
         out_dir / "reliability.png")
    fig, curves = curves_figure((logits / temperature).softmax(-1), target, class_names,
                                "test precision-recall per class")
    save(fig, out_dir / "pr_curves.png")
    report["curves"] = curves
    return files


def add_tta(report: dict, policy: str, tta: dict) -> str:
    """Add test-time augmentation's numbers to ``report``; returns the line comparing them."""
    report["tta"] = {"policy": policy, "accuracy": float(tta["test_tta/acc"]),
                     "f1_macro": float(tta["test_tta/f1_macro"]), "loss": float(tta["test_tta/loss"])}
    line = (f"Test-time augmentation ({policy}): accuracy {report['tta']['accuracy']:.4f} "
            f"(plain {report['accuracy']:.4f}), macro F1 {report['tta']['f1_macro']:.4f} "
            f"(plain {report['f1_macro']:.4f})")
    return line


class TestReport(Callback):
    """After ``test``: print the per-class table and write the report files.

    Args:
        top: how many of the highest-loss test images ``top_losses.png`` shows.
    """

    def __init__(self, top: int = 24) -> None:
        self.top = top

    def on_test_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        ckpt = trainer.ckpt_path
        out_dir = Path(ckpt).parent if ckpt else Path(trainer.log_dir or ".")  # log_dir: collective
        result = getattr(pl_module, "results", {}).get("test")
        if result is None or not trainer.is_global_zero:
            return
        tta = pl_module.results.get("test_tta")
        hp = pl_module.hparams
        write_report(result, pl_module.class_names, str(ckpt or "(in-memory model)"), out_dir,
                     (hp.tta, tta) if tta is not None else None,
                     samples=getattr(pl_module, "samples", {}).get("test"),
                     dataset=getattr(trainer.test_dataloaders, "dataset", None),
                     temperature=float(getattr(pl_module, "temperature", 1.0)),
                     mean=hp.get("mean"), std=hp.get("std"), top=self.top)
