"""evaluate's report for a multi-label model: report.{md,json}, the error co-occurrence picture
and mistakes.csv (every test image with a wrong label, highest loss first).

The summary and per-label numbers are the logged test metrics (at the thresholds fitted on the
validation set); the per-image rows come from the one prediction pass ``predict_dataset``.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import torch
from torchmetrics.functional.classification import multilabel_stat_scores

from project.common.files import atomic_path, write_text
from project.extras.analysis.plots import save
from project.tasks.multilabel.metrics import decisions, per_label_ap
from project.tasks.multilabel.views import cooccurrence_figure

SUMMARY = [("map", "mean average precision (macro)"), ("map_micro", "mean average precision (micro)"),
           ("acc", "exact match (every label right)"), ("f1", "macro F1"),
           ("precision", "macro precision"), ("recall", "macro recall"), ("loss", "loss")]
MISTAKE_FIELDS = ["path", "true", "predicted", "missed", "wrong", "loss"]


def label_rows(probs: torch.Tensor, targets: torch.Tensor, thresholds: torch.Tensor,
               names: list[str]) -> list[dict]:
    """Per label: AP, threshold, precision, recall, F1 and support, worst AP first."""
    ap = per_label_ap(probs, targets)
    stats = multilabel_stat_scores(decisions(probs, thresholds), targets.int(), len(names), average=None)
    rows = []
    for i, name in enumerate(names):
        tp, fp, _, fn, support = (float(v) for v in stats[i])
        precision, recall = tp / max(tp + fp, 1), tp / max(tp + fn, 1)
        rows.append({"label": name, "ap": None if ap[i].isnan() else float(ap[i]),
                     "threshold": float(thresholds[i]), "precision": precision, "recall": recall,
                     "f1": 2 * precision * recall / max(precision + recall, 1e-12), "support": int(support)})
    return sorted(rows, key=lambda r: (r["ap"] is None, r["ap"] if r["ap"] is not None else 0))


def image_rows(probs: torch.Tensor, targets: torch.Tensor, thresholds: torch.Tensor, names: list[str],
               paths: list[str]) -> list[dict]:
    """The images with at least one wrong label, highest BCE first."""
    predicted = decisions(probs, thresholds).bool()
    truth = targets.bool()
    loss = torch.nn.functional.binary_cross_entropy(probs.double().clamp(1e-12, 1 - 1e-12),
                                                    targets.double(), reduction="none").sum(1)
    rows = []
    for i in torch.argsort(loss, descending=True).tolist():
        missed, wrong = truth[i] & ~predicted[i], predicted[i] & ~truth[i]
        if not (missed.any() or wrong.any()):
            continue
        label = lambda mask: ";".join(n for n, m in zip(names, mask.tolist(), strict=True) if m)  # noqa: E731
        rows.append({"path": paths[i], "true": label(truth[i]), "predicted": label(predicted[i]),
                     "missed": label(missed), "wrong": label(wrong), "loss": round(float(loss[i]), 6)})
    return rows


def ap_text(ap: float | None) -> str:
    return "-" if ap is None else f"{ap:.4f}"


def write_multilabel_report(result: dict, names: list[str], checkpoint: str, out_dir: Path,
                            samples: dict[str, torch.Tensor], dataset, thresholds: torch.Tensor) -> dict:
    out_dir.mkdir(parents=True, exist_ok=True)
    probs, targets = samples["logits"].float().sigmoid(), samples["target"].float()
    paths = [dataset.samples[int(i)].path for i in samples["index"]]
    labels, mistakes = label_rows(probs, targets, thresholds, names), image_rows(probs, targets, thresholds,
                                                                                 names, paths)
    counts = result["test/confusion"]
    report = {"checkpoint": checkpoint, "task": "multilabel", "images": len(probs),
              **{k: float(result[f"test/{k}"]) for k, _ in SUMMARY},
              "labels": labels, "mistakes": len(mistakes), "error_cooccurrence": counts.tolist(),
              "class_names": names, "top_losses": mistakes[:10]}
    with atomic_path(out_dir / "mistakes.csv") as tmp, open(tmp, "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=MISTAKE_FIELDS)
        writer.writeheader()
        writer.writerows(mistakes)
    save(cooccurrence_figure(counts, names, "test: missed label vs wrongly predicted label"),
         out_dir / "error_cooccurrence.png")
    lines = [f"# Test report (multi-label)\n\nCheckpoint: `{checkpoint}`\n", "## Summary", "", "| | |",
             "|---|---|", f"| images | {report['images']} |"]
    lines += [f"| {text} | {report[k]:.4f} |" for k, text in SUMMARY]
    lines += [f"| images with a wrong label | {report['mistakes']} (`mistakes.csv`) |", "",
              "## Per label, worst first", "", "Thresholds fitted on the validation set (each "
              "label's best F1); precision, recall and F1 at them.", "",
              "| label | AP | threshold | precision | recall | F1 | support |", "|---" * 7 + "|"]
    lines += [f"| {r['label']} | {ap_text(r['ap'])} | {r['threshold']:.2f} | {r['precision']:.4f} | "
              f"{r['recall']:.4f} | {r['f1']:.4f} | {r['support']} |" for r in labels]
    lines += ["", "## Errors: missed label vs wrongly predicted label", "",
              "![error co-occurrence](error_cooccurrence.png)", "", "## Top losses", "",
              "| image | true | predicted | missed | wrong | loss |", "|---|---|---|---|---|---|"]
    lines += [f"| `{r['path']}` | {r['true']} | {r['predicted']} | {r['missed']} | {r['wrong']} | "
              f"{r['loss']:.3f} |" for r in mistakes[:10]]
    write_text(out_dir / "report.json", json.dumps(report, indent=2))
    write_text(out_dir / "report.md", "\n".join(lines) + "\n")
    print("\n".join(lines[4:4 + len(SUMMARY) + 3]))
    print("\nWorst labels by AP: " + ", ".join(f"{r['label']} {r['ap']:.3f}" for r in labels[:3]
                                               if r["ap"] is not None))
    return report
