"""Operators that make the host wait for the accelerator, counted on any device.

On a GPU the host queues kernels and runs ahead; an operator whose *output size or value* must be known on the host
(``.item()``, ``int(t)``, ``.tolist()``, ``nonzero``, ``unique``, a boolean-mask index, ``repeat_interleave`` without
``output_size``, ``bincount``, ...) stops it until every queued kernel has run, so a training step with dozens of them
runs at the speed of its launches. ``torch.cuda.set_sync_debug_mode`` reports them on a GPU only; :class:`SyncCounter`
records the same operators from the dispatcher, so a CPU test can hold a step to zero (tests/test_host_sync.py).

    with SyncCounter() as syncs:
        module.compute_losses(batch)["loss"].backward()
    assert syncs.total == 0, syncs.summary()
"""

from __future__ import annotations

import threading
import traceback
from collections import Counter
from contextlib import contextmanager

import numpy as np
import torch
from torch.utils._python_dispatch import TorchDispatchMode

# ATen overload packets whose result size or value is read on the host (CUDA: a device->host copy and a wait).
SYNCING_OPS = frozenset({
    "aten::_local_scalar_dense",  # .item(), int(t), float(t), bool(t), .tolist(), `if t:`
    "aten::nonzero", "aten::argwhere",  # torch.nonzero, torch.where(cond), x[bool mask] through index
    "aten::masked_select",
    "aten::_unique", "aten::_unique2", "aten::unique_dim", "aten::unique_consecutive", "aten::unique_dim_consecutive",
    "aten::bincount",  # sizes its output by the largest value
    "aten::histc",
    "aten::equal", "aten::is_nonzero", "aten::allclose",
    "aten::_assert_async",
})
_INDEXING_OPS = frozenset({"aten::index", "aten::index_put", "aten::index_put_", "aten::_index_put_impl",
                           "aten::_index_put_impl_"})


def _name(func) -> str:
    return func._schema.name  # "aten::nonzero"


def syncing(func, args, kwargs) -> str | None:
    """Why ``func(*args, **kwargs)`` makes the host wait (a short label), or None."""
    name = _name(func)
    if name in SYNCING_OPS:
        return name.removeprefix("aten::")
    if name == "aten::repeat_interleave":
        # torch.repeat_interleave(x, counts) reaches the dispatcher as repeat_interleave.Tensor(counts, output_size=)
        # (integer repeats decompose into expand and copy): without output_size it sums the counts on the host
        if torch.is_tensor(args[0]) and kwargs.get("output_size") is None and (len(args) < 2 or args[1] is None):
            return "repeat_interleave without output_size"
        return None
    if name in _INDEXING_OPS:
        indices = args[1] if len(args) > 1 else kwargs.get("indices", ())
        if any(torch.is_tensor(i) and i.dtype in (torch.bool, torch.uint8) for i in indices or ()):
            return "boolean-mask index"
    if name == "aten::_to_copy" or name == "aten::copy_":
        # a copy from an accelerator to the host (never seen on a CPU-only run)
        src = args[1] if name == "aten::copy_" else args[0]
        dst_device = kwargs.get("device") if name == "aten::_to_copy" else args[0].device
        if torch.is_tensor(src) and src.device.type not in ("cpu", "meta") and dst_device is not None \
                and torch.device(dst_device).type == "cpu":
            return "device-to-host copy"
    return None


_HOST = threading.local()


@contextmanager
def _host_reading():
    _HOST.depth = getattr(_HOST, "depth", 0) + 1
    try:
        yield
    finally:
        _HOST.depth -= 1


def host_numpy(tensor: torch.Tensor) -> np.ndarray:
    """A tensor made on the host (a random draw for a step's index bookkeeping, drawn by torch so that a run replays
    its generator's stream) as NumPy. Refuses a tensor on an accelerator: reading one would make the host wait."""
    if tensor.device.type != "cpu":
        raise ValueError(f"host_numpy takes host tensors; this one is on {tensor.device} (reading it would synchronise)")
    with _host_reading():
        return tensor.detach().numpy()


class SyncCounter(TorchDispatchMode):
    """Counts the host-synchronising operators (:func:`syncing`) run while it is active, with the suite's own source
    line that called each (``where``). ``total``: their number; ``counts``: by kind; :meth:`summary`: one line."""

    def __init__(self, stack: bool = True):
        super().__init__()
        self.counts: Counter = Counter()
        self.where: Counter = Counter()
        self.operators = 0  # every ATen operator dispatched (the step's operator count)
        self.stack = stack

    # read a tensor's values on the host without an ATen operator on a CPU tensor (a device-to-host copy on a GPU)
    _HOST_READS = ("tolist", "numpy", "__array__")

    def __enter__(self):
        self._saved = {name: getattr(torch.Tensor, name) for name in self._HOST_READS}
        for name, method in self._saved.items():
            setattr(torch.Tensor, name, self._counted(name, method))
        return super().__enter__()

    def __exit__(self, *exc):
        for name, method in self._saved.items():
            setattr(torch.Tensor, name, method)
        return super().__exit__(*exc)

    def _counted(self, name, method):
        def read(tensor, *args, **kwargs):
            if not getattr(_HOST, "depth", 0):
                self._record(f"Tensor.{name}")
            return method(tensor, *args, **kwargs)
        return read

    def _record(self, why: str) -> None:
        self.counts[why] += 1
        if self.stack:
            self.where[f"{why} at {_suite_frame()}"] += 1

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        self.operators += 1
        why = syncing(func, args, kwargs)
        if why is not None:
            self._record(why)
        return func(*args, **kwargs)

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def summary(self) -> str:
        kinds = ", ".join(f"{k} {n}" for k, n in self.counts.most_common())
        sites = "; ".join(f"{k} ({n})" for k, n in self.where.most_common(8))
        return f"{self.total} host synchronisations ({kinds or 'none'}){': ' + sites if sites else ''}"


def _suite_frame() -> str:
    """The innermost caller inside this repository (not torch, not this file), as file:line."""
    for frame in reversed(traceback.extract_stack()[:-3]):
        path = frame.filename.replace("\\", "/")
        if "/site-packages/" in path or path.endswith("host_sync.py") or "/torch/" in path:
            continue
        return f"{path.rsplit('/', 1)[-1]}:{frame.lineno}"
    return "?"
