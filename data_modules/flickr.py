"""Flickr30K and Flickr8k captions: one module, two formats.

* Karpathy split file (``dataset_flickr30k.json`` / ``dataset_flickr8k.json``): splits and captions
  from the file, images under ``image_dir``.
* Token file (``Flickr8k.token.txt`` or Flickr30K's ``results_20130124.token``, lines
  ``<file>#<i><TAB><caption>``) plus split lists (one file name a line; Flickr8k's official
  ``Flickr_8k.trainImages.txt`` / ``devImages`` / ``testImages`` by default). A split is the images
  of its list that have captions; images listed and captioned must be on disk.
"""

from __future__ import annotations

import logging
from pathlib import Path

from grounding.training_images import flickr_file_key

from .base import CaptionDataModule
from .captions import CaptionSplit, group_captions
from .file_checks import WORLD_HINT, MalformedDataError, MissingDataError, require_file, resolve
from .formats import read_flickr_token_pairs, read_text, split_lines
from .karpathy import karpathy_entries, karpathy_sentences, karpathy_split
from .options import CaptionLoaderOptions, ImageTransform, SplitSubsets

log = logging.getLogger(__name__)

FLICKR_LAYOUT = """\
  Karpathy format:  <root>/dataset_flickr30k.json (or dataset_flickr8k.json) + <root>/<image_dir>/<filename>.jpg
  token format:     <root>/Flickr8k.token.txt (or results_20130124.token)    lines "<file>.jpg#<i><TAB><caption>"
                    <root>/Flickr_8k.trainImages.txt, Flickr_8k.devImages.txt, Flickr_8k.testImages.txt
                                                                            one image file name a line
                    <root>/<image_dir>/<file>.jpg
  image_dir: "images" (or flickr30k-images / Flicker8k_Dataset / Flickr8k_Dataset) if present, else root"""

KARPATHY_CANDIDATES = ("dataset_flickr30k.json", "dataset_flickr8k.json")
TOKEN_CANDIDATES = ("Flickr8k.token.txt", "results_20130124.token", "results.token")
IMAGE_DIR_CANDIDATES = ("images", "flickr30k-images", "flickr30k_images", "Flicker8k_Dataset", "Flickr8k_Dataset",
                        "Images")
DEFAULT_SPLIT_FILES = {"train": "Flickr_8k.trainImages.txt", "val": "Flickr_8k.devImages.txt",
                       "test": "Flickr_8k.testImages.txt"}
FLICKR_HINT = (f"point root at your Flickr folder (and set karpathy_file or captions_file), or {WORLD_HINT} "
               "(root: data/world/flickr)")


def read_token_file(path: Path, dataset: str = "Flickr") -> dict[str, list[str]]:
    """``<file>#<i><TAB><caption>`` lines -> file name -> captions (in file order)."""
    return group_captions(read_flickr_token_pairs(path, MalformedDataError, FLICKR_HINT, dataset))


def read_split_list(path: Path, dataset: str = "Flickr") -> list[str]:
    """One image file name a line (blank lines skipped)."""
    text = read_text(path, MalformedDataError, FLICKR_HINT, dataset, "UTF-8 text, one image file name a line")
    return [ln.strip() for ln in split_lines(text) if ln.strip()]


def unlisted_captioned(captions: dict[str, list[str]], listed: set[str], image_dir: Path) -> dict[str, int]:
    """Captioned file names in no split list, skipped and counted (logged, never an error): ``photos`` on disk
    (Flickr8k's 91 photos outside the official lists; the 1,000-photo subset's 9) and ``no_photo`` names that
    name no file (Flickr8k.token.txt's malformed ``2258277193_586949ec62.jpg.1``)."""
    names = sorted(set(captions) - listed)
    no_photo = [n for n in names if not (image_dir / n).is_file()]
    counts = {"photos": len(names) - len(no_photo), "no_photo": len(no_photo)}
    if names:
        log.info("Flickr: %d captioned photo(s) in no split list skipped; %d caption id(s) naming no photo skipped%s",
                 counts["photos"], counts["no_photo"], f" (e.g. {no_photo[0]!r})" if no_photo else "")
    return counts


def listed_uncaptioned(listed: list[str], captions: dict[str, list[str]], image_dir: Path, list_path: Path,
                       token_path: Path) -> dict[str, int]:
    """A split list's names that the token file has no captions for: left out of the split, counted and said (one
    warning line naming an example): ``photos`` on disk (a token file covering only some photos, on purpose) and
    ``no_photo`` names of no file at all (a typo, or photos not copied)."""
    names = sorted(set(listed) - set(captions))
    no_photo = [n for n in names if not (image_dir / n).is_file()]
    if names:
        example = no_photo[0] if no_photo else names[0]
        log.warning("Flickr: %s lists %d image(s) that %s has no captions for, left out of the split (%d with no "
                    "photo in %s, e.g. %r)", list_path.name, len(names), token_path.name, len(no_photo), image_dir,
                    example)
    return {"photos": len(names) - len(no_photo), "no_photo": len(no_photo)}


class FlickrDataModule(CaptionDataModule):
    """Flickr30K / Flickr8k captions (see the module docstring).

    Args beyond the shared ones: ``karpathy_file`` OR ``captions_file`` (+ ``split_files``: split ->
    list file, default Flickr8k's official lists; val may be named "val" or "dev"), ``image_dir``
    (relative to root). With neither file set, a Karpathy file in root is used if present, else a
    token file. Real Flickr8k with only a subset of the photos: set ``captions_file`` to a token
    file listing just those (e.g. ``Flickr8k.token.1000img.txt``). ``subsets`` (``train`` / ``val`` /
    ``test``): a seeded sample of N training images / the first N dev / test images (the scaling curve; a
    cross-encoder's affordable validation). ``test_only``: train and val may be
    empty (an evaluation-only Karpathy file such as an MCD split of ``python -m grounding.composer mcd``).
    ``exclude_eval_images``: checkpoints or image lists whose images leave val/test (see
    :class:`~data_modules.base.CaptionDataModule`). Images are keyed by their Flickr photo id (``flickr:<id>``,
    from ``<id>.jpg`` / ``<id>_<secret>.jpg``), else by file name (grounding.training_images).
    """

    dataset_name = "Flickr"
    layout = FLICKR_LAYOUT
    hint = FLICKR_HINT

    def __init__(self, root: str = "data/world/flickr", karpathy_file: str | None = None,
                 captions_file: str | None = None, split_files: dict[str, str] | None = None,
                 image_dir: str | None = None, text_encoder: str = "minilm", max_length: int = 32,
                 batch_size: int = 32, eval_batch_size: int | None = None,
                 transform: ImageTransform = ImageTransform(), loader: CaptionLoaderOptions = CaptionLoaderOptions(),
                 seed: int = 0, subsets: SplitSubsets = SplitSubsets(), test_only: bool = False,
                 exclude_eval_images: list[str] | str | None = None):
        super().__init__(root, text_encoder, max_length, batch_size, eval_batch_size, transform, loader, seed, subsets,
                         exclude_eval_images)
        if karpathy_file and captions_file:
            raise ValueError("FlickrDataModule: set karpathy_file OR captions_file, not both")
        self.karpathy_file = karpathy_file
        self.captions_file = captions_file
        self.split_files = dict(split_files) if split_files else None
        if self.split_files is not None and "dev" in self.split_files and "val" not in self.split_files:
            self.split_files["val"] = self.split_files.pop("dev")
        if self.split_files is not None and set(self.split_files) != {"train", "val", "test"}:
            raise ValueError(f"FlickrDataModule: split_files needs keys train, val (or dev), test; got "
                             f"{sorted(self.split_files)}")
        self.image_dir = image_dir
        self.required_splits = ("test",) if test_only else CaptionDataModule.required_splits

    def _image_dir(self, root: Path) -> Path:
        if self.image_dir is not None:
            d = resolve(root, self.image_dir)
            if not d.is_dir():
                raise MissingDataError(f"Flickr: image_dir {d} does not exist.\nExpected layout:\n{FLICKR_LAYOUT}\n"
                                       "Fix: set image_dir to the folder holding the .jpg files.")
            return d
        for name in IMAGE_DIR_CANDIDATES:
            if (root / name).is_dir():
                return root / name
        return root

    def _source(self, root: Path) -> tuple[str, Path]:
        if self.karpathy_file:
            return "karpathy", resolve(root, self.karpathy_file)
        if self.captions_file:
            return "token", resolve(root, self.captions_file)
        for name in KARPATHY_CANDIDATES:
            if (root / name).is_file():
                return "karpathy", root / name
        for name in TOKEN_CANDIDATES:
            if (root / name).is_file():
                return "token", root / name
        raise MissingDataError(
            f"Flickr: no caption file in {root} (looked for {', '.join(KARPATHY_CANDIDATES + TOKEN_CANDIDATES)}).\n"
            f"Expected layout:\n{FLICKR_LAYOUT}\nFix: set karpathy_file or captions_file, or {FLICKR_HINT}.")

    def input_files(self, root: Path) -> list[tuple[Path, str]]:
        kind, path = self._source(root)
        self._image_dir(root)  # a configured image_dir that does not exist: its own message
        files = [(path, FLICKR_HINT)]
        if kind == "token":
            files += [(resolve(root, name), "set split_files to your image lists, one per split")
                      for name in (self.split_files or DEFAULT_SPLIT_FILES).values()]
        return files

    def read_splits(self, root: Path) -> dict[str, CaptionSplit]:
        kind, path = self._source(root)
        require_file(path, self.dataset_name, FLICKR_LAYOUT, FLICKR_HINT)
        image_dir = self._image_dir(root)
        splits = {s: CaptionSplit() for s in ("train", "val", "test")}
        if kind == "karpathy":
            for e in karpathy_entries(path, self.dataset_name, FLICKR_HINT):
                split = karpathy_split(e, use_restval=True)
                if split is not None:
                    splits[split].add(image_dir / e.file_name, karpathy_sentences(e), flickr_file_key(e.file_name))
            return splits

        captions = read_token_file(path, self.dataset_name)
        self.listed_uncaptioned: dict[str, dict[str, int]] = {}
        split_files = self.split_files or DEFAULT_SPLIT_FILES
        listed_names: set[str] = set()
        for split, name in split_files.items():
            list_path = require_file(
                resolve(root, name), self.dataset_name, FLICKR_LAYOUT,
                "the token format needs one image list per split (Flickr8k ships Flickr_8k.trainImages.txt, "
                "Flickr_8k.devImages.txt, Flickr_8k.testImages.txt; Flickr30K has no official lists: use Karpathy's "
                "dataset_flickr30k.json as karpathy_file) or set split_files: {train: ..., val: ..., test: ...}")
            listed = read_split_list(list_path, self.dataset_name)
            for file_name in listed:  # the split = its listed images that have captions
                if file_name in captions:
                    splits[split].add(image_dir / file_name, captions[file_name], flickr_file_key(file_name))
            self.listed_uncaptioned[split] = listed_uncaptioned(listed, captions, image_dir, list_path, path)
            listed_names.update(listed)
        self.unlisted_captioned = unlisted_captioned(captions, listed_names, image_dir)
        self._captions_path = path
        return splits

    def missing_image_hint(self, root: Path) -> str:
        hint = f"put the photos in {self._image_dir(root)} (or set image_dir)"
        captions_path = getattr(self, "_captions_path", None)
        if captions_path is not None:
            others = sorted(p.name for p in root.glob("*.token*") if p.is_file() and p != captions_path)
            hint += (", or, if you have only some of the photos, set captions_file to a token file that lists just "
                     "those" + (f" (found here: {', '.join(others)})" if others else ""))
        return hint
