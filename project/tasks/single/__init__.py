"""One class per image (the default task; class folders hold it): a softmax over the classes,
cross-entropy (or the focal loss), accuracy, macro F1, per-class P/R/F1, the confusion matrix,
a temperature to calibrate. Torch-free here: ``answers.py`` and ``labels.py`` load without torch."""
