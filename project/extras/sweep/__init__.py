"""Hyperparameter sweeps on Optuna: ``python -m project sweep`` (docs/sweeps.md).

space.py    the YAML search space: parse, check against the training config, sample
study.py    the study and its storage (SQLite beside the runs, or a database URL), pruners
trials.py   one trial = one ordinary ``fit`` run in a child process; the sweep loop
pruning.py  the callback inside that run: reports the metric, stops a pruned trial
results.py  table, CSV, best.yaml, plots, the seed re-runs
command.py  the command line
"""
