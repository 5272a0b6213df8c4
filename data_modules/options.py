"""The option groups every DataModule of the suite shares, defined once: the image transform, the loader, and the
caption splits' subsets. A config writes each as a nested mapping (``transform: {resize_size: 224}``), the command
line one field of it (``--data.init_args.transform.resize_size 224``); the options users type most (``root``,
``batch_size``, ``eval_batch_size``, ``text_encoder``, ``max_length``, ``seed``, ``exclude_eval_images``) stay at
the DataModule's top level. An option's former flat name is refused with one line naming its new place
(grounding/renamed_options.py); a Python caller, or a run recorded before the groups, may still give it flat:
:func:`grounding.nets.regroup_init` moves it into its group.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from grounding.encoders import IMAGENET_MEAN, IMAGENET_STD
from grounding.nets import check_choices

from .captions import CAPTIONS_PER_EPOCH


@dataclass(frozen=True)
class ImageTransform:
    """How a DataModule turns an image into the network's input: the short side resized to ``resize_size``, a centre
    crop of ``image_size``, normalised with ``mean`` / ``std`` (per RGB channel). Where the model's network names
    them, ``image_size`` follows its ``image_size`` and ``mean`` / ``std`` its ``backbone``'s statistics (linked by
    the CLI, grounding/cli.py): a config sets them here only for a model without such a network."""

    image_size: int = 224
    resize_size: int = 256
    mean: tuple[float, float, float] = IMAGENET_MEAN
    std: tuple[float, float, float] = IMAGENET_STD

    def __post_init__(self):
        object.__setattr__(self, "mean", tuple(self.mean))  # a list from Python or a recorded config
        object.__setattr__(self, "std", tuple(self.std))


@dataclass(frozen=True)
class LoaderOptions:
    """The DataLoaders' settings: ``num_workers`` worker processes (0: the main process loads), ``pin_memory`` (page-
    locked batches, for a GPU), ``drop_last`` (training drops its last, smaller batch; evaluation never does)."""

    num_workers: int = 0
    pin_memory: bool = False
    drop_last: bool = False


@dataclass(frozen=True)
class CaptionLoaderOptions(LoaderOptions):
    """:class:`LoaderOptions` of a DataModule that serves captions, with its training sampler: ``captions_per_epoch``
    ``one`` (a seeded draw of one caption per image an epoch) or ``all`` (every caption of every training image once
    an epoch, in rounds that hold each image at most once: :class:`~data_modules.captions.CaptionRoundsSampler`)."""

    captions_per_epoch: Literal["one", "all"] = "one"

    def __post_init__(self):
        check_choices(self, "loader.", captions_per_epoch=CAPTIONS_PER_EPOCH)


@dataclass(frozen=True)
class SplitSubsets:
    """Part of a caption DataModule's splits (null: the whole split). ``train``: a seeded random sample of N training
    images (COMPOSER's C30K: 29,000 COCO images; the seed is the DataModule's ``seed``); ``val`` / ``test``: the first
    N validation / test images (COCO's 1K test: the first 1,000; an exhaustive validation on COCO's 5,000 is too slow
    for a cross-encoder). Applied after ``exclude_eval_images``."""

    train: int | None = None
    val: int | None = None
    test: int | None = None

    def __post_init__(self):
        for name in ("train", "val", "test"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise ValueError(f"subsets.{name} must be >= 0 images (or null: the whole split); got {value}")


# the caption DataModules' subset options that changed their names as they moved into ``subsets``
SUBSET_RENAMES = {"train_subset": "subsets.train", "val_subset": "subsets.val", "test_subset": "subsets.test"}
