"""LightningDataModules of the suite: COCO captions, Flickr30K / Flickr8k, Visual Genome, the WordNet
similarity lists, ImageNet-style class folders and GLUE's tasks, plus the embedded world generator (``python -m
data_modules.synthetic``) and its object crops (``python -m data_modules.object_crops``). Data sits
below the models: this package imports only the suite's core (``grounding/*.py``, ``grounding/utils``);
what needs a model (SemCLIP's VLM-embedded alignment pairs) lives in ``grounding.semclip``.

Every class is importable from here so the CLI can select it by name
(``data: {class_path: data_modules.FlickrDataModule, init_args: {...}}``). Imports are lazy: the
world generator and the dataset readers must not pay for torch/lightning when they do not use them.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "CocoCaptionsDataModule": "coco",
    "FlickrDataModule": "flickr",
    "CaptionDataModule": "base", "GroundingDataModule": "base", "CaptionDataset": "captions",
    "CorruptImageError": "errors", "DataError": "errors", "MalformedDataError": "errors", "MissingDataError": "errors",
    "LabelMapping": "visual_genome", "VisualGenomeDataModule": "visual_genome", "VisualGenomeDataset": "visual_genome",
    "VocabularyLabelMapping": "visual_genome",
    "CleanedVGLabelMapping": "vg_cleaning",
    "SimilarityListsDataModule": "similarity_lists",
    "GlueDataModule": "glue",
    "ImageFolderDataModule": "image_folder", "ImageFolderDataset": "image_folder",
}
__all__ = sorted(_EXPORTS)
# Modules holding LightningDataModules: imported by the CLI so classes resolve by short name.
DATAMODULE_MODULES = ("coco", "flickr", "visual_genome", "similarity_lists", "image_folder", "glue")


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module 'data_modules' has no attribute {name!r}")


def __dir__():
    return __all__
