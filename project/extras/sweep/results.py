"""What a sweep leaves for people: a table of all trials (terminal and CSV), the best trial as a
ready command line and a config overlay (best.yaml), and Optuna's plots as PNG files."""

from __future__ import annotations

import csv
import io
import shlex
import statistics
import warnings
from pathlib import Path

import optuna
import yaml
from optuna.trial import TrialState

from project.common.files import atomic_path, write_text
from project.extras.sweep.space import Param, nested, overrides


def trial_rows(study: optuna.Study, space: list[Param]) -> list[dict]:
    """One row per trial: number, state, value, epochs, duration, the parameters, the run folder."""
    rows = []
    for t in study.get_trials(deepcopy=False):
        row = {"trial": t.number, "state": t.state.name, "value": t.value,
               "epochs": t.user_attrs.get("epochs", len(t.intermediate_values) or None),
               "duration_s": round(t.duration.total_seconds(), 1) if t.duration else None}
        row.update({p.key: p.decode(t.params[p.key]) if p.key in t.params else None for p in space})
        row["worker"] = t.user_attrs.get("worker", "")  # host:pid, the machine holding run_dir
        row["run_dir"] = t.user_attrs.get("run_dir", "")
        rows.append(row)
    return rows


def _cell(value: object) -> str:
    if value is None:
        return "-"
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def format_table(rows: list[dict], metric: str) -> str:
    """A fixed-width table; the value column is named after the metric."""
    if not rows:
        return "(no trials yet)"
    columns = [c for c in rows[0] if c not in ("run_dir", "worker")]
    header = [metric if c == "value" else c for c in columns]
    cells = [[_cell(r[c]) for c in columns] for r in rows]
    widths = [max(len(h), *(len(row[i]) for row in cells)) for i, h in enumerate(header)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True))]
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in cells]
    return "\n".join(lines)


def write_csv(rows: list[dict], path: Path) -> None:
    buffer = io.StringIO()
    if rows:
        writer = csv.DictWriter(buffer, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows({k: ("" if v is None else v) for k, v in r.items()} for r in rows)
    write_text(path, buffer.getvalue())


def best_trial(study: optuna.Study) -> optuna.trial.FrozenTrial | None:
    if not any(t.state == TrialState.COMPLETE for t in study.get_trials(deepcopy=False)):
        return None
    return study.best_trial


def best_values(trial: optuna.trial.FrozenTrial, space: list[Param]) -> dict:
    return {p.key: p.decode(trial.params[p.key]) for p in space if p.key in trial.params}


def write_best(study: optuna.Study, space: list[Param], base_args: list[str], metric: str,
               path: Path) -> str:
    """Save the best trial's parameters as a config overlay; return the fit command line."""
    best = best_trial(study)
    assert best is not None
    values = best_values(best, space)
    command = shlex.join(["python", "-m", "project", "fit", *base_args, "--config", str(path)])
    explicit = shlex.join(["python", "-m", "project", "fit", *base_args, *overrides(values)])
    header = (f"# Best trial {best.number} of study '{study.study_name}': {metric}={best.value:.4f} "
              f"({study.direction.name.lower()}).\n# Stack it on the sweep's settings:\n#   {command}\n"
              f"# or, the same on one line:\n#   {explicit}\n")
    write_text(path, header + yaml.safe_dump(nested(values), sort_keys=False))
    return command


def save_plots(study: optuna.Study, folder: Path) -> list[str]:
    """history.png (value per trial, best so far), importance.png (which parameters mattered)
    and curves.png (the metric per epoch of every trial: what the pruner saw). A plot that
    needs more finished trials is skipped with the reason."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from optuna.visualization import matplotlib as vis

    notes = []
    plots = {"history.png": vis.plot_optimization_history, "curves.png": vis.plot_intermediate_values,
             "importance.png": lambda s: vis.plot_param_importances(s, evaluator=_importance_evaluator())}
    for name, plot in plots.items():
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                ax = plot(study)
            figure = getattr(ax, "figure", None) or ax.flat[0].figure
            figure.set_size_inches(8, 5)
            figure.tight_layout()
            with atomic_path(folder / name) as tmp:
                figure.savefig(tmp, format="png", dpi=100)
            plt.close(figure)
        except (ValueError, RuntimeError, ImportError, ZeroDivisionError) as err:
            # a plot is a convenience: too few trials for it must not lose the sweep
            notes.append(f"{name} skipped: {str(err).splitlines()[0] if str(err) else type(err).__name__}")
            (folder / name).unlink(missing_ok=True)  # an earlier report's would pass for this one
    return notes


def _importance_evaluator():
    """fANOVA when scikit-learn is installed (Optuna's default), else PED-ANOVA (no extra package)."""
    try:
        import sklearn  # noqa: F401
    except ImportError:
        return optuna.importance.PedAnovaImportanceEvaluator()
    return optuna.importance.FanovaImportanceEvaluator(seed=0)


def seed_summary(results: dict[int, float], metric: str) -> str:
    """Mean and standard deviation over seeds: how much of a trial's value was luck."""
    values = list(results.values())
    spread = statistics.stdev(values) if len(values) > 1 else 0.0
    listed = ", ".join(f"seed {s}: {v:.4f}" for s, v in results.items())
    return (f"{metric} over {len(values)} seed(s): mean {statistics.mean(values):.4f}, "
            f"std {spread:.4f} ({listed})")
