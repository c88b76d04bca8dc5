"""Any number of labels per image: a sigmoid per label, BCE (or the asymmetric loss), mAP, and
metrics at per-label thresholds fitted on the validation set. Torch-free here."""
