"""Old module names that still import, so runs trained before a rename keep loading.

A LightningCLI checkpoint records its LightningModule's dotted class path (``hyper_parameters._class_path``) and a
run's ``config.yaml`` the DataModule's; ``test --ckpt_path`` and ``--config <run>/config.yaml`` import them again.
When a module is renamed, its old name is listed here: importing it gives the new module itself (the same module
object, so the same classes), with a ``FutureWarning`` naming the new path, and ``python -m <old name>`` runs the
new module. The finder sits last on ``sys.meta_path``, so it is asked only about names no file provides.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings

# old dotted name -> new dotted name (names that say what the module holds)
RENAMED_MODULES = {
    "grounding.semclip.align": "grounding.semclip.alignment_training",  # SemCLIPAlignment (Γ_t's LightningModule)
    "grounding.semclip.alignment_pairs": "grounding.semclip.alignment_data",  # AlignmentPairsDataModule
    "grounding.vgbert.search": "grounding.vgbert.image_search",  # the `python -m` image-search command
    # names that say which is which: VG-BERT's dual encoder vs COMPOSER's VSE/ViLBERT; the data file checks vs the
    # suite's error reporting; COMPOSER's per-caption CRG extraction vs the graph build over a caption set
    "grounding.vgbert.baseline": "grounding.vgbert.dual_encoder",
    "grounding.composer.baselines": "grounding.composer.vse_vilbert",
    "data_modules.errors": "data_modules.file_checks",
    "grounding.composer.crg": "grounding.composer.crg_extraction",
    "grounding.composer.build": "grounding.composer.graph_build",
}


class _AliasLoader(importlib.abc.Loader):
    def __init__(self, old: str, new: str):
        self.old, self.new = old, new

    def create_module(self, spec):
        warnings.warn(f"{self.old} was renamed {self.new}; use the new name", FutureWarning, stacklevel=2)
        module = importlib.import_module(self.new)
        self.spec = module.__spec__
        return module

    def exec_module(self, module) -> None:
        # the new module is already executed; the import system has just set its __spec__ to the old name's, so it
        # gets its own back (find_spec and pickling read it)
        module.__spec__ = self.spec

    def get_code(self, fullname: str):  # runpy (`python -m <old name>`) runs the new module's code
        warnings.warn(f"python -m {self.old} is now python -m {self.new}", FutureWarning, stacklevel=2)
        return importlib.util.find_spec(self.new).loader.get_code(self.new)


class RenamedModuleFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname: str, path=None, target=None):
        new = RENAMED_MODULES.get(fullname)
        if new is None:
            return None
        return importlib.util.spec_from_loader(fullname, _AliasLoader(fullname, new))


def install() -> None:
    """Put the finder last on ``sys.meta_path`` (once)."""
    if not any(isinstance(f, RenamedModuleFinder) for f in sys.meta_path):
        sys.meta_path.append(RenamedModuleFinder())
