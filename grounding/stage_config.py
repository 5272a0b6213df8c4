"""Reading a training stage's config without the CLI: ``base:`` layering, config-file options first, a parser of one
stage config for commands that read it without training, and the one-line error for a config that cannot be read.
Used by the CLI (``grounding.cli``) and by the papers' own commands (COMPOSER's cost, SemCLIP's, the semantic space's);
it sits below them, so nothing here imports a paper package or the CLI."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Optional

import yaml
from jsonargparse import ActionConfigFile, ArgumentParser

from grounding.errors import UserInputError


class ConfigError(UserInputError, ValueError):
    """A stage config that ``python -m grounding`` cannot parse (one line for the user)."""


def expand_config_bases(args: list[str]) -> list[str]:
    """``--config FILE`` whose YAML names ``base: OTHER`` becomes ``--config OTHER --config <FILE's other
    keys>`` (recursively), so jsonargparse merges the override onto its base in that order."""
    out, i = [], 0
    while i < len(args):
        arg = args[i]
        if arg == "--config" and i + 1 < len(args):
            out += _config_chain(args[i + 1])
            i += 2
            continue
        if arg.startswith("--config="):
            out += _config_chain(arg.split("=", 1)[1])
        else:
            out.append(arg)
        i += 1
    return out


NULLS = ("null", "None", "~")


def nested_nulls_as_config(args: list[str]) -> list[str]:
    """``--<key> null`` for a key nested below a class's argument (``--model.init_args.net.init_args.relation.
    classifier_hidden null``, an option group's field; ``--data.init_args.captions.init_args.karpathy_file null``)
    becomes the same value as an inline ``--config`` at the same place: jsonargparse (4.53) reads such a flag's null
    as the string "None". Other arguments are kept as they are."""
    out, i = [], 0
    while i < len(args):
        arg, value, used = args[i], None, 1
        if arg.startswith("--") and "=" in arg:
            arg, value = arg.split("=", 1)
        elif arg.startswith("--") and i + 1 < len(args):
            value, used = args[i + 1], 2
        key = arg[2:]
        head, _, rest = key.partition(".init_args.")
        if arg.startswith("--") and value in NULLS and head and "." in rest:
            nested: dict = {}
            node = nested
            parts = key.split(".")
            for part in parts[:-1]:
                node = node.setdefault(part, {})
            node[parts[-1]] = None
            out += ["--config", yaml.safe_dump(nested, default_flow_style=True).strip()]
            i += used
            continue
        out.append(args[i])
        i += 1
    return out


def config_options_first(argv: list[str]) -> list[str]:
    """``--config FILE`` options moved to the front: jsonargparse applies arguments in order, so options
    given on the command line then win over the file (the non-training commands' convention)."""
    configs, rest, i = [], [], 0
    while i < len(argv):
        if argv[i] == "--config" and i + 1 < len(argv):
            configs += argv[i:i + 2]
            i += 2
        else:
            (configs if argv[i].startswith("--config=") else rest).append(argv[i])
            i += 1
    return configs + rest


def stage_config_parser(cls: type, section: str) -> ArgumentParser:
    """A parser of one training-stage config for commands that read it without training: ``section``
    (``model`` or ``data``) is type-checked against ``cls`` (a subclass of it), the other sections pass
    unchecked. Give it ``expand_config_bases(["--config", path])``."""
    p = ArgumentParser(exit_on_error=False)
    p.add_argument("--config", action=ActionConfigFile)
    p.add_subclass_arguments(cls, section, required=True)
    p.add_argument(f"--{'data' if section == 'model' else 'model'}", type=Optional[dict], default=None)
    for key in ("seed_everything", "trainer", "optimizer", "lr_scheduler", "ckpt_path"):  # the trainer's keys: unused
        p.add_argument(f"--{key}", type=Any, default=None)
    return p


class _UniqueKeyLoader(yaml.SafeLoader):
    """YAML's safe loader, except that a key given twice in one mapping is an error (PyYAML keeps the last value in
    silence: an edited config would train with whichever line came last)."""

    def construct_mapping(self, node, deep=False):
        seen: dict = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            try:
                earlier = seen.setdefault(key, key_node.start_mark.line + 1)
            except TypeError:  # an unhashable key: PyYAML's own error follows
                continue
            if earlier != key_node.start_mark.line + 1:
                raise yaml.constructor.ConstructorError(
                    None, None, f"key '{key}' is given twice (lines {earlier} and {key_node.start_mark.line + 1}); "
                    "YAML would keep only the last: remove one", key_node.start_mark)
        return super().construct_mapping(node, deep)


def load_yaml_unique_keys(text: str):
    """``yaml.safe_load`` that refuses a key given twice in one mapping (a ``yaml.YAMLError`` naming both lines)."""
    return yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader


def read_config_yaml(file: Path):
    """A config file's YAML; a syntax error, a key given twice or unreadable bytes: :class:`ConfigError` naming the
    file, line and column."""
    try:
        return load_yaml_unique_keys(file.read_text(encoding="utf-8"))
    except UnicodeDecodeError as e:
        raise ConfigError(f"{file}: not UTF-8 text (byte {e.start}); save the config as UTF-8 YAML") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{file}:{mark.line + 1}:{mark.column + 1}" if mark is not None else str(file)
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        if isinstance(e, yaml.constructor.ConstructorError) and "given twice" in problem:
            raise ConfigError(f"{where}: {problem}") from None
        raise ConfigError(f"{where}: YAML syntax error ({problem}); fix the file") from None


def _config_chain(path: str, seen: tuple[str, ...] = ()) -> list[str]:
    file = Path(path)
    try:
        is_file = file.is_file()
    except OSError:  # an inline YAML string longer than a file name can be
        is_file = False
    if not is_file:
        return ["--config", path]  # jsonargparse reports it (or it is an inline YAML string)
    cfg = read_config_yaml(file)
    if not isinstance(cfg, dict):
        what = "is empty" if cfg is None else f"holds a {type(cfg).__name__} at its top level"
        raise ConfigError(f"{file} {what}; a stage config is a mapping of model:, data: and trainer: (see "
                          "experiments/ for examples, docs/configs.md for the layout)")
    if "base" not in cfg:
        return ["--config", path]
    base = (file.parent / cfg.pop("base")).resolve()
    if str(base) in seen or not base.is_file():
        print(f"{path}: `base: {base}` " + ("is a cycle of bases" if base.is_file() else "does not exist")
              + "; name an existing config file, relative to this one.", file=sys.stderr)
        raise SystemExit(2)
    return _config_chain(str(base), (*seen, str(base))) + ["--config", yaml.safe_dump(cfg, sort_keys=False)]
