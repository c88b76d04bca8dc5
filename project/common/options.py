"""argparse types of the project's own commands: a bad value is refused by argparse in one line
naming the option, before any model loads."""

import argparse


def positive_int(text: str) -> int:
    """An argparse type for counts (``--top_k``, ``--batch_size``, ``--workers``): 0 or less is
    refused by argparse in one line naming the option, not by an IndexError later."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def device(text: str) -> str:
    """An argparse type for ``--device``: a device this machine has (cpu, cuda, cuda:N, gpu, mps),
    refused in one line before any model loads (not by a CUDA traceback mid-run)."""
    import torch

    name = {"gpu": "cuda"}.get(text.lower(), text.lower())
    try:
        kind = torch.device(name)
    except RuntimeError:
        raise argparse.ArgumentTypeError(f"'{text}' is not a device: pass cpu, cuda, cuda:N or mps") from None
    if kind.type == "cuda" and not torch.cuda.is_available():
        raise argparse.ArgumentTypeError(f"'{text}': torch sees no CUDA GPU on this machine: pass cpu")
    if kind.type == "cuda" and kind.index is not None and kind.index >= torch.cuda.device_count():
        raise argparse.ArgumentTypeError(f"'{text}': this machine has {torch.cuda.device_count()} GPU(s), "
                                         f"numbered from 0")
    if kind.type == "mps" and not torch.backends.mps.is_available():
        raise argparse.ArgumentTypeError(f"'{text}': this machine has no Apple GPU (mps): pass cpu")
    if kind.type not in ("cpu", "cuda", "mps"):
        raise argparse.ArgumentTypeError(f"'{text}' is not a device: pass cpu, cuda, cuda:N or mps")
    return name


def accelerator(text: str) -> str:
    """``--accelerator`` of the server: auto, or a :func:`device` this machine has."""
    return "auto" if text.lower() == "auto" else device(text)
