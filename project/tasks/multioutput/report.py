"""evaluate's report for a multi-output model: report.{md,json}, a confusion matrix per column
and mistakes.csv (every test image with a wrong column, the least confident first)."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import torch

from project.common.files import atomic_path, write_text
from project.extras.analysis.plots import save
from project.tasks.multioutput import groups
from project.tasks.single.views import confusion_figure


def write_report(task, result: dict, checkpoint: str, out_dir: Path, samples: dict[str, torch.Tensor],
                 dataset, top: int) -> dict:
    out_dir.mkdir(parents=True, exist_ok=True)
    probs, target = task.outputs(samples["logits"]), samples["target"].long()
    predicted = task.predicted(samples["logits"])
    paths = [dataset.samples[int(i)].path for i in samples["index"]]
    columns = groups(task.names)
    per_column = {c: {"acc": float(result[f"test/per_column/acc/{c}"]),
                      "macro_f1": float(result[f"test/per_column/macro_f1/{c}"]), "classes": len(classes)}
                  for c, classes in columns}
    given = torch.stack([probs[:, part].gather(1, target[:, [j]])[:, 0]
                         for j, (_, part) in enumerate(task.columns)], -1)
    rows = []
    for i in given.min(1).values.argsort().tolist():  # the least confident in a given class first
        wrong = [c for j, (c, _) in enumerate(columns) if predicted[i, j] != target[i, j]]
        if wrong:
            row = {"path": paths[i], "wrong": ";".join(wrong)}
            for j, (c, classes) in enumerate(columns):
                row[f"true_{c}"] = classes[int(target[i, j])]
                row[f"predicted_{c}"] = classes[int(predicted[i, j])]
            rows.append(row)
    report = {"checkpoint": checkpoint, "task": task.name, "images": len(paths),
              "acc": float(result["test/acc"]), "macro_f1": float(result["test/macro_f1"]),
              "loss": float(result["test/loss"]), "columns": per_column, "mistakes": len(rows),
              "worst": rows[:top]}
    for c, classes in columns:
        figure = confusion_figure(result[f"test/confusion/{c}"], classes, f"test {c}")
        save(figure, out_dir / f"confusion_{c}.png")
    with atomic_path(out_dir / "mistakes.csv") as tmp, open(tmp, "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]) if rows else ["path", "wrong"])
        writer.writeheader()
        writer.writerows(rows)
    lines = [f"# Test report (multi-output)\n\nCheckpoint: `{checkpoint}`  \n{len(paths)} test images; "
             f"mean accuracy over the columns {report['acc']:.4f}, mean macro F1 {report['macro_f1']:.4f}\n",
             "| column | classes | accuracy | macro F1 |", "|---|---|---|---|"]
    lines += [f"| {c} | {v['classes']} | {v['acc']:.4f} | {v['macro_f1']:.4f} |"
              for c, v in per_column.items()]
    lines += ["", f"{len(rows)} images with a wrong column: mistakes.csv", ""]
    lines += [f"![{c}](confusion_{c}.png)" for c, _ in columns]
    write_text(out_dir / "report.md", "\n".join(lines) + "\n")
    write_text(out_dir / "report.json", json.dumps(report, indent=2))
    print("\n".join(lines[1:3 + len(per_column)]))
    return report
