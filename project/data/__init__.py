"""Data: folder discovery and splits, decoding and cache, datasets, samplers, transforms, demo set."""

from project.data.datamodule import FolderDataModule

__all__ = ["FolderDataModule"]
