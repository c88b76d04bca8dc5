"""Several classes per image, one from each of two or more columns (``image,category,color``): a
softmax per column, per-column accuracy and macro F1, the mean of the columns' accuracies
monitored, one class per column in the answers. Torch-free here."""

SEP = "="  # an output's name: column=class (the model's class_names, the ONNX metadata's)


def groups(names: list[str]) -> list[tuple[str, list[str]]]:
    """(column, its classes) in output order, from names ``column=class``."""
    found: dict[str, list[str]] = {}
    for name in names:
        column, _, value = name.partition(SEP)
        found.setdefault(column, []).append(value)
    return list(found.items())
