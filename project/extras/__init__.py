"""Extras: everything beyond the training path. Each is imported only when its command or preset
runs; a default ``make train`` never loads them.

analysis/   evaluate (report, top losses, mistakes), calibration, suspect labels, analysis preset
deploy/     export (ONNX, INT8, TorchScript, .pt2) with verification, predict, torch-free infer.py,
            serve (LitServe)
diagnose/   overfit, LR finder, batch-size finder, gradient-norm and data-wait monitors
datatools/  check-data, resize-data
streaming/  optimize-data and streaming from LitData shards
sweep/      Optuna sweeps
timm_hub.py timm backbones and the Hugging Face cache; zoo.py lists backbones; fsdp.py sharding
"""
