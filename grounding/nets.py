"""Networks that remember how they were built, so a checkpoint can rebuild them.

A LightningModule receives its built network as ``net`` (the lightning-hydra-template pattern: the
config holds ``model.init_args.net: {class_path, init_args}``) and its own constructor holds training
options only. A checkpoint must still be self-contained, whether the module was built by the CLI or
in Python: every injectable network derives from :class:`RecordedNet`, which records its own
constructor arguments; :func:`net_spec` turns a network into ``{"class_path", "init_args"}`` (stored
in the module's hyperparameters) and :func:`build_net` rebuilds one from that spec.

A network with many switches groups them by concern into option dataclasses (``Composer(sizes=...,
composition=...)``; a config writes each group as a nested mapping). They are recorded as plain mappings, so a
checkpoint's hyperparameters stay plain data, and :func:`constructor_args` turns recorded arguments back into a
constructor call, moving the flat arguments of checkpoints written before a group existed into it.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import inspect
import typing
from collections.abc import Mapping
from typing import Any

from torch import nn


class RecordedNet(nn.Module):
    """An ``nn.Module`` whose ``init_args`` are the arguments its (most derived) constructor received."""

    init_args: dict[str, Any]

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if "__init__" not in vars(cls):
            return
        init = cls.__init__
        signature = inspect.signature(init)

        @functools.wraps(init)
        def recorded_init(self, *args, **kw):
            init(self, *args, **kw)
            # The most derived constructor records, after its parents' ran (they see another __init__).
            if type(self).__init__ is recorded_init:
                bound = signature.bind(self, *args, **kw)
                bound.apply_defaults()
                # option groups as plain mappings: a checkpoint's hyperparameters hold no pickled classes
                self.init_args = {k: dataclasses.asdict(v) if is_options(v) else v
                                  for k, v in bound.arguments.items() if k != "self"}

        cls.__init__ = recorded_init


def is_options(value) -> bool:
    """Whether ``value`` is an option group: an instance of a dataclass."""
    return dataclasses.is_dataclass(value) and not isinstance(value, type)


def check_choices(options, where: str = "", **choices: tuple) -> None:
    """An option group's ``__post_init__`` check: each named field's value is one of its allowed choices, else a
    ``ValueError`` naming the field (``where``: a prefix naming the owner)."""
    for name, allowed in choices.items():
        if getattr(options, name) not in allowed:
            raise ValueError(f"{where}{name} must be one of {allowed}; got {getattr(options, name)!r}")


def option_groups(cls: type) -> dict[str, type]:
    """The constructor parameters of ``cls`` typed as an option dataclass, by name."""
    try:
        hints = typing.get_type_hints(cls.__init__)
    except Exception:  # a library class whose annotations do not resolve here has no option groups of ours
        return {}
    return {name: hint for name, hint in hints.items() if isinstance(hint, type) and dataclasses.is_dataclass(hint)}


def constructor_args(cls: type, init_args: Mapping[str, Any]) -> dict[str, Any]:
    """``cls``'s keyword arguments from recorded ``init_args``: each option group given as a mapping becomes its
    dataclass (its keys over the constructor's default group), and a flat argument that is a field of a group moves
    into it, replacing the group's value (a checkpoint written before the group existed, also under its former name:
    ``renamed_options``; :func:`build_net`'s overrides). Unknown names are left for the constructor."""
    args = dict(init_args)
    params = inspect.signature(cls.__init__).parameters
    own = set(params)
    renamed: dict[str, dict[str, Any]] = {}
    for old, new in dict(getattr(cls, "renamed_options", {})).items():
        if old in args:
            group_name, _, field = new.partition(".")
            renamed.setdefault(group_name, {})[field] = args.pop(old)
    for name, group in option_groups(cls).items():
        fields = {f.name for f in dataclasses.fields(group)} - own
        value = args.get(name)
        moved = {**renamed.get(name, {}), **{key: args.pop(key) for key in [k for k in args if k in fields]}}
        # a mapping's keys and flat fields go over the constructor's own default group (COMPOSER's DataModule's
        # loader drops its last batch), as jsonargparse fills a config's partial group
        default = params[name].default if name in params else None
        given = dataclasses.asdict(default) if is_options(default) and not is_options(value) else {}
        given.update(dataclasses.asdict(value) if is_options(value) else dict(value or {}))
        if value is not None or moved:
            args[name] = group(**{**given, **moved})
    return args


def regroup_init(cls: type, record_as_mappings: bool = False) -> None:
    """Wrap ``cls.__init__`` (when ``cls`` defines one) so its keyword arguments pass through :func:`constructor_args`:
    an option group given as a mapping (a checkpoint's hyperparameters, a config read by hand) becomes its dataclass,
    and a flat argument of before the group (also under its former name, ``renamed_options``) moves into it; a run
    recorded before the groups resumes. The signature jsonargparse and Lightning read stays the constructor's own.
    ``record_as_mappings`` (a LightningModule): its hyperparameters hold the groups as plain mappings, so a checkpoint
    holds no pickled class."""
    if "__init__" not in vars(cls):
        return
    init = cls.__init__

    @functools.wraps(init)
    def regrouped_init(self, *args, **kwargs):
        init(self, *args, **constructor_args(cls, kwargs))
        for recorded in ("_hparams", "_hparams_initial") if record_as_mappings else ():  # the checkpoint's, the logger's
            hparams = getattr(self, recorded, None) or {}
            for name, value in list(hparams.items()):
                if is_options(value):
                    hparams[name] = dataclasses.asdict(value)

    regrouped_init.__signature__ = inspect.signature(init)  # Lightning's checkpoint loading reads the real arguments
    cls.__init__ = regrouped_init


def flat_args(cls: type, init_args: Mapping[str, Any]) -> dict[str, Any]:
    """Recorded ``init_args`` (grouped or flat) as one level: the fields each group gives beside the other arguments
    (a group given as a mapping adds only its own keys, no defaults)."""
    groups, args = option_groups(cls), {}
    for name, value in init_args.items():
        if name in groups and value is not None:
            args.update(dataclasses.asdict(value) if is_options(value) else dict(value))
        else:
            args[name] = value
    return args


def moved_options(cls: type) -> dict[str, str]:
    """``cls``'s former flat argument names and where each is now (``ct_layers`` -> ``sizes.ct_layers``): every
    option group's fields, and the class's own ``renamed_options`` (a field that changed its name as it moved)."""
    own = set(inspect.signature(cls.__init__).parameters)
    renamed = dict(getattr(cls, "renamed_options", {}))
    moved = {f.name: f"{group}.{f.name}" for group, options in option_groups(cls).items()
             for f in dataclasses.fields(options)
             if f.name not in own and f"{group}.{f.name}" not in renamed.values()}  # renamed: never flat by this name
    return {**moved, **renamed}


def regrouped_spec(spec):
    """A recorded spec ``{class_path, init_args}`` (a network's, or a config's class) with its ``init_args`` in its
    class's option groups (plain mappings); anything else, or a class that does not import, is returned as it is."""
    if not isinstance(spec, Mapping) or not isinstance(spec.get("init_args"), Mapping):
        return spec
    cls = class_of(spec.get("class_path"))
    if cls is None or not option_groups(cls):
        return spec
    try:
        args = constructor_args(cls, spec["init_args"])
    except (TypeError, ValueError):  # a value its group refuses: left for the parser to report
        return spec
    return {**spec, "init_args": {k: dataclasses.asdict(v) if is_options(v) else v for k, v in args.items()}}


def regrouped_config(config):
    """A config (nested mappings) with every ``{class_path, init_args}`` in it regrouped (:func:`regrouped_spec`),
    inner ones included: a run's recorded config of before the option groups compares with today's."""
    if isinstance(config, Mapping):
        config = regrouped_spec({key: regrouped_config(value) for key, value in config.items()})
    elif isinstance(config, list):
        config = [regrouped_config(value) for value in config]
    return config


def net_spec(net: RecordedNet) -> dict:
    """``{"class_path": "<module>.<Class>", "init_args": {...}}`` of a built network."""
    if not isinstance(net, RecordedNet):
        raise TypeError(f"{type(net).__qualname__} does not record its constructor arguments; derive it from "
                        "grounding.nets.RecordedNet so checkpoints can rebuild it.")
    return {"class_path": f"{type(net).__module__}.{type(net).__qualname__}", "init_args": dict(net.init_args)}


def class_of(class_path: str | None) -> type | None:
    """The class a dotted path names (``grounding.vgbert.pretrain.GroundingPretrain``), or None when it imports none."""
    module, _, name = str(class_path or "").rpartition(".")
    try:
        found = getattr(importlib.import_module(module), name) if module else None
    except (ImportError, AttributeError, ValueError):
        return None
    return found if isinstance(found, type) else None


def build_net(spec: dict, **overrides) -> nn.Module:
    """The network a :func:`net_spec` describes, with ``overrides`` replacing some of its init args."""
    if not isinstance(spec, dict) or "class_path" not in spec:
        raise ValueError(f"expected a network spec {{'class_path': ..., 'init_args': {{...}}}}; got {spec!r}")
    module_name, _, class_name = spec["class_path"].rpartition(".")
    cls = getattr(importlib.import_module(module_name), class_name)
    return cls(**constructor_args(cls, {**dict(spec.get("init_args") or {}), **overrides}))


def as_net(net: nn.Module | dict) -> nn.Module:
    """A LightningModule's ``net`` argument: a built network, or its spec (``load_from_checkpoint``
    outside the CLI passes the stored hyperparameters back in)."""
    return build_net(net) if isinstance(net, dict) else net


def net_hparams(hparams: dict) -> dict:
    """The architecture arguments of a checkpoint's hyperparameters: the network's ``init_args`` when
    the network was injected, else the hyperparameters themselves (modules that build their own)."""
    net = hparams.get("net")
    if isinstance(net, dict) and isinstance(net.get("init_args"), dict):
        return net["init_args"]
    return hparams
