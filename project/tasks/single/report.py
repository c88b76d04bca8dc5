"""The test report: a per-class table on the console, report.{json,md} and its pictures.

Written next to the evaluated checkpoint, so each model file keeps its own report: report.md
(summary, per-class table with average precision, confusion matrix, most confused pairs, top
losses, calibration), report.json, confusion_matrix.png, pr_curves.png, top_losses.png,
reliability.png and mistakes.csv (every misclassified test image, highest loss first).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torchmetrics.functional.classification import multiclass_accuracy, multiclass_f1_score

from project.common.files import write_text
from project.common.preprocessing import Preprocessing
from project.extras.analysis.abstain import abstain_markdown, abstain_numbers, risk_coverage_figure
from project.extras.analysis.calibration import calibration_numbers
from project.extras.analysis.plots import curves_figure, reliability_figure, save
from project.extras.analysis.predictions import calibrated_probabilities
from project.extras.analysis.rows import mistakes, sample_rows, top_losses_figure, write_mistakes_csv
from project.tasks.single.metrics import PER_CLASS
from project.tasks.single.views import confused_pairs, confusion_figure, pairs_markdown


def per_class_table(values: dict[str, torch.Tensor], stage: str, class_names: list[str],
                    ap: dict[str, float] | None = None) -> dict:
    """Per-class precision, recall, F1 (the logged values), average precision, support, and the
    macro (over the classes the split holds or the model predicted, as the summary's) and
    support-weighted averages."""
    confusion = values[f"{stage}/confusion"].detach().cpu().double()
    support = confusion.sum(1)
    seen = (support + confusion.sum(0)) > 0  # as torchmetrics' macro: not a class never true nor predicted
    cols = {k: torch.stack([values[f"{stage}/per_class/{k}/{c}"].detach().cpu().double()
                            for c in class_names])
            for k in PER_CLASS}
    if ap is not None:
        cols["ap"] = torch.tensor([ap[c] for c in class_names], dtype=torch.float64)
    rows = {name: {**{k: float(cols[k][i]) for k in cols}, "support": int(support[i])}
            for i, name in enumerate(class_names)}
    weights, total = support / support.sum().clamp(min=1), int(support.sum())
    averages = {"macro avg": {**{k: float(v[seen].nanmean()) for k, v in cols.items()}, "support": total},
                "weighted avg": {**{k: float((v.nan_to_num() * weights).sum()) for k, v in cols.items()},
                                 "support": total}}
    return {"classes": rows, "averages": averages, "accuracy": float(values[f"{stage}/acc"])}


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


def write_report(result: dict, class_names: list[str], checkpoint: str, out_dir: Path,
                 samples: dict[str, torch.Tensor], dataset: object, temperature: float,
                 preprocessing: Preprocessing, top: int = 24, target_acc: float = 0.99) -> dict:
    """Print the table and write the report files; returns the report as a dict. ``result``:
    the logged test metrics; ``samples``: every test image's logits (``predict_dataset``, with
    ``mirrored`` for test-time augmentation); ``dataset`` gives their files and pixels."""
    out_dir.mkdir(parents=True, exist_ok=True)
    logits, target = samples["logits"], samples["target"]
    probs = calibrated_probabilities(logits, temperature)
    fig, curves = curves_figure(probs, target, class_names, "test precision-recall per class")
    save(fig, out_dir / "pr_curves.png")
    table = per_class_table(result, "test", class_names, curves["ap"])
    confusion = result["test/confusion"]
    pairs = confused_pairs(confusion, class_names)
    rows = sample_rows(samples, class_names, temperature, dataset)
    calibration = calibration_numbers(logits, target, temperature)
    abstain = abstain_numbers(probs, target, target_acc)
    report = {"checkpoint": checkpoint, **table, "images": int(confusion.sum()),
              "loss": float(result["test/loss"]), "nll": calibration["nll_after"],
              "macro_acc": float(result["test/macro_acc"]), "macro_f1": float(result["test/macro_f1"]),
              "ap_macro": table["averages"]["macro avg"]["ap"], "auroc": curves.get("auroc"),
              "calibration": calibration, "abstain": abstain, "mistakes": len(mistakes(rows)),
              "confusion_matrix": confusion.tolist(), "class_names": class_names, "confused_pairs": pairs,
              "top_losses": [{k: r[k] for k in ("path", "true", "predicted", "probability", "loss",
                                                "runner_up", "runner_up_probability")} for r in rows[:10]]}
    if "mirrored" in samples:  # test-time augmentation: the mean probabilities of each image and its mirror
        tta = (probs + calibrated_probabilities(samples["mirrored"], temperature)) / 2
        n = len(class_names)
        report["tta"] = {"policy": "hflip",
                         "accuracy": float(multiclass_accuracy(tta, target, n, average="micro")),
                         "macro_f1": float(multiclass_f1_score(tta, target, n, average="macro"))}
    write_mistakes_csv(rows, out_dir / "mistakes.csv")
    save(confusion_figure(confusion, class_names, "test confusion matrix"), out_dir / "confusion_matrix.png")
    save(reliability_figure(logits, target, temperature, title="test reliability diagram"),
         out_dir / "reliability.png")
    save(risk_coverage_figure(probs, target, target_acc), out_dir / "risk_coverage.png")
    files = {"mistakes.csv", "confusion_matrix.png", "reliability.png", "pr_curves.png", "risk_coverage.png"}
    fig = top_losses_figure(rows, dataset, preprocessing.mean, preprocessing.std, "test top losses", top)
    if fig is not None:
        save(fig, out_dir / "top_losses.png")
        files.add("top_losses.png")
    else:  # --top 0, or nothing wrong: an earlier report's picture would pass for this one's
        (out_dir / "top_losses.png").unlink(missing_ok=True)
    write_text(out_dir / "report.json", json.dumps(report, indent=2))
    write_text(out_dir / "report.md", format_markdown(report, pairs, files))
    print("\n" + format_table(table))
    if pairs:
        print("\nMost confused (true -> predicted): " + ", ".join(
            f"{p['true']} -> {p['predicted']} ({p['count']})" for p in pairs))
    print(f"\nCalibration: ECE {calibration['ece_before']:.4f} (raw softmax) -> "
          f"{calibration['ece_after']:.4f} "
          f"(temperature {calibration['temperature']:.4f})")
    if "tta" in report:
        print(tta_line(report))
    best = abstain["at_target"]
    print(f"Abstaining: accuracy {best['accuracy']:.4f} (target {target_acc:.3g}) on {best['coverage']:.1%} "
          f"of the test images with --min_confidence {best['min_confidence']:.4f}" if best else
          f"Abstaining: the target accuracy {target_acc:.3g} is not reached at any confidence threshold")
    return report


def tta_line(report: dict) -> str:
    t = report["tta"]
    return (f"Test-time augmentation ({t['policy']}): accuracy {t['accuracy']:.4f} (plain "
            f"{report['accuracy']:.4f}), macro F1 {t['macro_f1']:.4f} (plain {report['macro_f1']:.4f})")


def format_markdown(report: dict, pairs: list[dict], files: set[str]) -> str:
    """report.md, in reading order; each picture referenced by its file name (they sit beside)."""
    cal = report["calibration"]
    lines = [f"# Test report\n\nCheckpoint: `{report['checkpoint']}`\n", "## Summary", "", "| | |",
             "|---|---|",
             f"| images | {report['images']} |", f"| accuracy | **{report['accuracy']:.4f}** |",
             f"| balanced accuracy (macro recall) | {report['macro_acc']:.4f} |",
             f"| macro F1 | {report['macro_f1']:.4f} |",
             f"| mean average precision | {report['ap_macro']:.4f} |"]
    if report.get("auroc") is not None:
        lines.append(f"| AUROC | {report['auroc']:.4f} |")
    lines += [f"| NLL | {report['nll']:.4f} |", f"| ECE | {cal['ece_after']:.4f} (temperature "
              f"{cal['temperature']:.3f}; raw softmax {cal['ece_before']:.4f}) |",
              f"| misclassified | {report['mistakes']} (`mistakes.csv`) |", "",
              "## Per-class results", "", "| class | precision | recall | f1 | AP | support |",
              "|---|---|---|---|---|---|"]
    for name, r in list(report["classes"].items()) + list(report["averages"].items()):
        lines.append(f"| {name} | {r['precision']:.4f} | {r['recall']:.4f} | {r['f1']:.4f} | {r['ap']:.4f} "
                     f"| {r['support']} |")
    lines += ["", "Precision-recall per class" + (" and ROC" if report.get("auroc") is not None else "")
              + " (average precision in the legend):", "", "![precision-recall curves](pr_curves.png)",
              "", "## Confusion matrix", "", "Rows: true class; colour: share of the true class.", "",
              "![confusion matrix](confusion_matrix.png)", "", "## Most confused pairs", "",
              pairs_markdown(pairs), "", "## Top losses", "",
              "The test images the model is most wrong about (red: misclassified), titled true / "
              "predicted / probability. Every misclassified image is in `mistakes.csv`.", ""]
    if "top_losses.png" in files:
        lines += ["![top losses](top_losses.png)", ""]
    lines += ["| image | true | predicted | probability | loss | runner-up |", "|---|---|---|---|---|---|"]
    lines += [f"| `{r['path']}` | {r['true']} | {r['predicted']} | {r['probability']:.3f} | {r['loss']:.3f} "
              f"| {r['runner_up']} ({r['runner_up_probability']:.3f}) |" for r in report["top_losses"]]
    fitted = (f"Temperature {cal['temperature']:.4f}, fitted on the validation set, divides the logits "
              "before the softmax." if cal["temperature"] != 1.0 else
              "No temperature was fitted (`python -m project calibrate`).")
    lines += ["", "## Calibration", "", "Expected calibration error (ECE, 15 bins): the average gap "
              f"between confidence and accuracy. {fitted}", "", "| | raw softmax | with temperature |",
              "|---|---|---|", f"| NLL | {cal['nll_before']:.4f} | {cal['nll_after']:.4f} |",
              f"| ECE | {cal['ece_before']:.4f} | {cal['ece_after']:.4f} |", "",
              "![reliability diagram](reliability.png)"]
    lines += ["", *abstain_markdown(report["abstain"])]
    if "tta" in report:
        lines += ["", tta_line(report)]
    return "\n".join(lines) + "\n"
