"""Options that moved: a flag or config key under a former name is refused with one line naming its new place, before
jsonargparse parses (whose answer would be its whole usage, without the new name).

The table of moved options is read off the classes a config names, so it cannot drift from them: for the class at
``model``, its ``net``, ``data`` and COMPOSER's ``data.init_args.captions``, the former names relative to the class's
``init_args`` and where each is now (:func:`class_moves`):

* a stage model's network options, which moved under ``net.init_args`` when the networks were injected
  (``model.init_args.backbone`` -> ``model.init_args.net.init_args.backbone``; also a grouped one:
  ``model.init_args.ct_layers`` -> ``model.init_args.net.init_args.sizes.ct_layers``);
* every option group's fields and the renamed ones (:func:`grounding.nets.moved_options`): a network's
  (``net.init_args.ct_layers`` -> ``net.init_args.sizes.ct_layers``), a model's (``mvsa_loss`` -> ``losses.mvsa_loss``)
  and a DataModule's (``image_size`` -> ``transform.image_size``, ``num_workers`` -> ``loader.num_workers``,
  ``train_subset`` -> ``subsets.train``: data_modules/options.py).

:func:`moved_option_table` lists it for a set of classes (docs/configs.md, "Renamed options");
:func:`check_renamed_options` checks a command line: its flags, and every config file it names with the files their
``base:`` chains name, each key against the class the merged config gives that place. Sits in the core: it reaches the
classes by their dotted paths (``class_of``), never by import.
"""

from __future__ import annotations

import copy
import functools
import inspect
import typing
from pathlib import Path
from typing import Iterable

import yaml

from grounding.nets import class_of, moved_options
from grounding.stage_config import ConfigError

SECTIONS = ("model", "data")  # the config's class-selected sections (subclass mode)
RESERVED = ("class_path", "init_args", "dict_kwargs", "__path__")
COMMAND_LINE = "the command line"
MAX_SHOWN = 6  # moved keys named in the message; more are counted


class MovedOptionError(ConfigError):
    """A flag or config key names an option under its former name (one line: the old key, the new, where to fix)."""


# ------------------------------------------------------------------------------------------ the table
def _parameters(cls: type) -> set[str]:
    try:
        params = inspect.signature(cls).parameters.values()
    except (TypeError, ValueError):
        return set()
    return {p.name for p in params if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)}


def annotated_net(cls: type) -> type | None:
    """The network class a stage model's ``net`` argument is annotated with (None: no ``net``)."""
    try:
        hint = typing.get_type_hints(cls.__init__).get("net")
    except Exception:  # annotations that do not resolve here: no network moves
        return None
    return hint if isinstance(hint, type) else None


@functools.lru_cache(maxsize=None)
def class_moves(cls: type, net: type | None = None) -> dict[str, str]:
    """``cls``'s former option names -> where each is now, both relative to its ``init_args`` (``backbone`` ->
    ``net.init_args.backbone``, ``image_size`` -> ``transform.image_size``). ``net``: the network class the config
    gives the model (default: its ``net`` annotation)."""
    own = _parameters(cls)
    moves = {old: new for old, new in moved_options(cls).items() if old not in own}
    net = net or annotated_net(cls)
    if net is not None and "net" in own:
        net_moves = moved_options(net)
        for name in sorted(_parameters(net) | set(net_moves)):
            if name not in own and name not in moves:
                moves[name] = f"net.init_args.{net_moves.get(name, name)}"
    return moves


def moved_option_table(classes: Iterable[type]) -> list[tuple[str, str, str]]:
    """(class name, former key, key now) of every moved option of ``classes``, keys relative to the class's
    ``init_args``."""
    return [(cls.__name__, old, new) for cls in classes for old, new in sorted(class_moves(cls).items())]


def resolve_class(name) -> type | None:
    """The class a config's ``class_path`` names: a dotted path, or a LightningModule / LightningDataModule's bare
    name (``--model GroundingPretrain``) among the classes imported so far."""
    if not isinstance(name, str) or not name:
        return None
    if "." in name:
        return class_of(name)
    from lightning.pytorch import LightningDataModule, LightningModule  # heavy (torch): only for a bare class name

    found, todo = None, [LightningModule, LightningDataModule]
    while todo and found is None:
        base = todo.pop()
        for sub in base.__subclasses__():
            if sub.__name__ == name:
                found = sub
                break
            todo.append(sub)
    return found


# ------------------------------------------------------------------------------------------ the command line
def _nested(dotted: str, value) -> dict:
    node: dict = {}
    top = node
    parts = dotted.split(".")
    for part in parts[:-1]:
        node = node.setdefault(part, {})
    node[parts[-1]] = value
    return top


def _yaml_value(text: str):
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


def _file_layers(path: str, seen: tuple[str, ...] = ()) -> list[tuple[str, dict]] | None:
    """(file, its keys) of a config file and the bases it names, base first; None when ``path`` is no file."""
    file = Path(path)
    try:
        if not file.is_file():
            return None
        cfg = yaml.safe_load(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):  # an unreadable file: the parse reports it
        return []
    if not isinstance(cfg, dict):
        return []
    layers: list[tuple[str, dict]] = []
    base = cfg.get("base")
    if isinstance(base, str):
        resolved = (file.parent / base).resolve()
        if str(resolved) not in seen:
            layers = _file_layers(str(resolved), (*seen, str(resolved))) or []
    return [*layers, (_shown_path(file), {k: v for k, v in cfg.items() if k != "base"})]


def _shown_path(file: Path) -> str:
    try:
        return str(file.resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(file)


def config_layers(argv: list[str]) -> list[tuple[str, dict, bool]]:
    """The command line as config layers, in the order jsonargparse applies them: (where, keys, given as flags)."""
    layers, i = [], 0
    while i < len(argv):
        arg, value, used = argv[i], None, 1
        if not arg.startswith("--"):
            i += 1
            continue
        key = arg[2:]
        if "=" in key:
            key, value = key.split("=", 1)
        elif i + 1 < len(argv) and not argv[i + 1].startswith("--"):
            value, used = argv[i + 1], 2
        if key == "config" and value is not None:
            files = _file_layers(value)
            if files is not None:
                layers += [(where, cfg, False) for where, cfg in files]
            elif isinstance(inline := _yaml_value(value), dict):
                layers.append((f"an inline --config on {COMMAND_LINE}", inline, False))
        elif key.split(".")[0] in SECTIONS and value is not None:
            layers.append((COMMAND_LINE, _nested(key, _yaml_value(value)), True))
        i += used
    return layers


def _as_class_node(node) -> dict | None:
    """A subclass position's mapping with its short-form keys (``model.backbone``) under ``init_args``; a bare string
    is its ``class_path`` (``--model GroundingPretrain``)."""
    if isinstance(node, str):
        return {"class_path": node, "init_args": {}}
    if not isinstance(node, dict):
        return None
    init = dict(node.get("init_args") or {}) if isinstance(node.get("init_args"), dict) else {}
    init.update({k: v for k, v in node.items() if k not in RESERVED})
    return {**{k: node[k] for k in ("class_path",) if k in node}, "init_args": init}


def _merge(into: dict, layer: dict) -> dict:
    """``layer``'s keys over ``into``'s, nested mappings merged (``layer`` is left as it is)."""
    for key, value in layer.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = copy.deepcopy(value)
    return into


def _is_class_node(node) -> bool:
    return isinstance(node, dict) and ("class_path" in node or "init_args" in node)


def _moved_keys(layer, merged, path: str) -> list[tuple[str, str]]:
    """(old key, new key) of the moved options the layer's class node at ``path`` gives (and the nodes below it)."""
    layer, merged = _as_class_node(layer), _as_class_node(merged)
    if layer is None or merged is None:
        return []
    cls = resolve_class(merged.get("class_path"))
    if cls is None:
        return []
    merged_init = merged["init_args"]
    net = _as_class_node(merged_init.get("net"))
    moves = class_moves(cls, resolve_class(net.get("class_path")) if net else None)
    found = []
    for key, value in layer["init_args"].items():
        if key in moves:
            found.append((f"{path}.init_args.{key}", f"{path}.init_args.{moves[key]}"))
        elif _is_class_node(value) or (isinstance(value, (dict, str)) and _is_class_node(merged_init.get(key))):
            found += _moved_keys(value, merged_init.get(key), f"{path}.init_args.{key}")
    return found


def moved_keys(argv: list[str]) -> list[tuple[str, str, str, bool]]:
    """(where, old key, new key, given as a flag) of every option ``argv`` gives under a former name."""
    layers = config_layers(argv)
    merged: dict = {}
    for _, cfg, _ in layers:
        _merge(merged, {k: _as_class_node(v) or v for k, v in cfg.items() if k in SECTIONS})
    found = []
    for where, cfg, flag in layers:
        for section in SECTIONS:
            if section in cfg and section in merged:
                found += [(where, old, new, flag) for old, new in _moved_keys(cfg[section], merged[section], section)]
    return found


def check_renamed_options(argv) -> None:
    """Raise :class:`MovedOptionError` (one line) when ``argv`` gives an option under a former name: each old key, its
    new one, and the file (or the command line) to rename it in."""
    if not isinstance(argv, (list, tuple)):
        return
    found = moved_keys([str(a) for a in argv])
    if not found:
        return
    parts, places = [], []
    for where, old, new, flag in found[:MAX_SHOWN]:
        dash = "--" if flag else ""
        parts.append(f"{dash}{old} is now {dash}{new}")
        places.append(where)
    more = f" (and {len(found) - MAX_SHOWN} more)" if len(found) > MAX_SHOWN else ""
    places = list(dict.fromkeys(places))
    them = "it" if len(found) == 1 else "them"
    raise MovedOptionError(f"{'; '.join(parts)}{more} (moved); rename {them} in {' and '.join(places)} "
                           "(docs/configs.md, \"Renamed options\")")
