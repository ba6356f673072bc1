"""A CUDA device on the CPU: tensors that compute on the CPU but mix with CPU tensors only where CUDA's do.

A port that runs with `--device cuda` gets its inputs on the GPU. Whatever it makes without
`device=` (a module-level constant, `torch.arange(n)`, a table it caches) lives on the CPU, and the
first operation that meets both raises "Expected all tensors to be on the same device". A CPU-only
machine never sees that, so this stand-in plays the GPU: inside `on_standin_device()`, a tensor is
"on the device" when it came from `to_device()`, from a factory given `device=` a CUDA device, from
`.to(<CUDA>)`/`.cuda()`, or from any operation on such a tensor. Those report `device` cuda:0 and
`is_cuda` True, so code that follows its inputs (`device=x.device`, `.to(x.device)`) lands there.
An operation that meets both kinds raises as CUDA would, with the same rules (MIXING), which
examples/cuda/standin_check.py checks against a real GPU: CPU 0-dim tensors mix freely (as Python
scalars do), a CUDA tensor takes CPU indices, `copy_` and `__setitem__` copy across, and `.numpy()`
of a device tensor raises. The values are the CPU's, so every case is also judged.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten, tree_map

DEVICE = torch.device("cuda", 0)
_MARK = "_on_standin_device"
_MIXED = "Expected all tensors to be on the same device, but found at least two devices, cuda:0 and cpu! (stand-in)"
_PROPERTIES = {"device": DEVICE, "is_cuda": True, "is_cpu": False}  # of a tensor on the device


def on_device(t: Any) -> bool:
    return isinstance(t, torch.Tensor) and getattr(t, _MARK, False)


def _mark(t: torch.Tensor) -> torch.Tensor:
    setattr(t, _MARK, True)
    return t


def _is_cuda(device: Any) -> bool:
    if isinstance(device, torch.Tensor):
        return on_device(device)
    if isinstance(device, int):
        return True  # .to(0), .cuda(0)
    return device is not None and torch.device(device).type == "cuda"


def _target(args: tuple, kwargs: dict) -> Any:
    """The device a `.to(...)` call asks for, or None when it changes only the dtype."""
    if "device" in kwargs:
        return kwargs["device"]
    for a in args[1:]:
        if isinstance(a, torch.Tensor | torch.device | str | int) and not isinstance(a, bool):
            return a
    return None


def to_device(t: torch.Tensor) -> torch.Tensor:
    """A copy of CPU tensor t, on the stand-in device."""
    return _mark(t.detach().clone())


def to_cpu(t: Any) -> Any:
    """t back on the CPU (a copy), as `.cpu()` of a CUDA tensor; anything else unchanged."""
    if not on_device(t):
        return t
    return t.detach().clone()  # a new tensor object, without the mark


class _StandinMode(TorchFunctionMode):
    def __torch_function__(self, func: Callable, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        self_ = args[0] if args else None
        if getattr(func, "__name__", "") == "__get__" and on_device(self_):
            prop = getattr(getattr(func, "__self__", None), "__name__", "")
            if prop in _PROPERTIES:
                return _PROPERTIES[prop]
        if func is torch.Tensor.get_device and on_device(self_):
            return 0
        if func is torch.Tensor.numpy and on_device(self_):
            raise TypeError(
                "can't convert cuda:0 device type tensor to numpy. Use Tensor.cpu() to copy the tensor to host memory first."
            )
        if func is torch.Tensor.cpu:
            return to_cpu(self_) if on_device(self_) else self_
        if func is torch.Tensor.cuda:
            return self_ if on_device(self_) else to_device(self_)
        if func is torch.Tensor.to:
            return self._to(func, args, kwargs)
        cuda_factory = _is_cuda(kwargs.get("device")) if "device" in kwargs else False
        if cuda_factory:
            kwargs = {**kwargs, "device": "cpu"}
        self._check_mixing(func, args, kwargs)
        marked = cuda_factory or any(on_device(t) for t in tree_flatten((args, kwargs))[0])
        out = func(*args, **kwargs)
        if marked:
            tree_map(lambda t: _mark(t) if isinstance(t, torch.Tensor) else t, out)
        return out

    @staticmethod
    def _to(func: Callable, args: tuple, kwargs: dict) -> Any:
        self_, target = args[0], _target(args, kwargs)
        if target is None:  # a dtype change: stays where it is
            out = func(*args, **kwargs)
            return _mark(out) if on_device(self_) and out is not self_ else out
        rest = [a for a in args[1:] if a is not target]
        if isinstance(target, torch.Tensor):
            rest.insert(0, target.dtype)
            kwargs = {**kwargs, "copy": kwargs.get("copy", False)}
        kw = {k: v for k, v in kwargs.items() if k != "device"}
        out = func(self_, *rest, **kw) if rest or kw else self_
        if _is_cuda(target):
            if on_device(self_):
                return out if out is self_ else _mark(out)
            return to_device(out)
        if on_device(self_):
            return to_cpu(out)
        return out

    @staticmethod
    def _check_mixing(func: Callable, args: tuple, kwargs: dict) -> None:
        tensors = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
        device = [t for t in tensors if on_device(t)]
        host = [t for t in tensors if not on_device(t) and t.dim() > 0]
        if not device or not host or func is torch.Tensor.copy_:  # copy_ crosses either way
            return
        if func is torch.Tensor.__getitem__ and on_device(args[0]):  # its indices may be on either
            return
        if func is torch.Tensor.__setitem__ and _accepts_assignment(*args[:3]):
            return
        raise RuntimeError(f"{_MIXED} in {getattr(func, '__qualname__', func)}")


def _accepts_assignment(target: torch.Tensor, index: Any, value: Any) -> bool:
    """`target[index] = value` across devices: a plain (basic) index copies either way; an advanced one
    (tensor or list indices, index_put_) takes indices from either on a device target, values only from
    the target's device (or a 0-dim CPU tensor)."""
    parts = index if isinstance(index, tuple) else (index,)
    if not any(isinstance(i, torch.Tensor | list) for i in parts):
        return True
    value_ok = not isinstance(value, torch.Tensor) or value.dim() == 0 or on_device(value) == on_device(target)
    return on_device(target) and value_ok


@contextlib.contextmanager
def on_standin_device() -> Iterator[None]:
    """Within: the stand-in's rules (module docstring) hold for every torch call."""
    with _StandinMode():
        yield


class StandinDeviceAdapter:
    """What harness/adapters/device.py does with `--device cuda`, on the stand-in: inputs moved to the
    device, the implementation run under its rules, outputs moved back (anything left on the CPU too)."""

    def __init__(self, impl):
        self.impl = impl

    def supports(self, component: str) -> bool:
        return self.impl.supports(component)

    def run(self, component: str, inputs: dict[str, torch.Tensor], params: dict[str, Any]) -> Any:
        moved = {k: to_device(v) for k, v in inputs.items()}
        with on_standin_device():
            outputs = self.impl.run(component, moved, params)
        if not isinstance(outputs, dict):
            return outputs
        return {k: to_cpu(v) for k, v in outputs.items()}


# Mixed-device patterns and whether a real GPU accepts each (True) or raises (False): the stand-in must
# agree on every one (tests/test_device_standin.py here, examples/cuda/standin_check.py on a GPU).
# Each takes a device tensor maker `d` and a host one `h` (both from a list of floats).
MIXING: dict[str, tuple[bool, Callable]] = {
    "add, both [3]": (False, lambda d, h: d([1.0, 2, 3]) + h([1.0, 2, 3])),
    "add, a CPU 0-dim tensor": (True, lambda d, h: d([1.0, 2, 3]) + torch.tensor(2.0)),
    "compare with a CPU [3]": (False, lambda d, h: d([1.0, 2, 3]).unsqueeze(-1) > h([1.0, 2])),
    "matmul": (False, lambda d, h: d([1.0, 2]).view(1, 2) @ h([1.0, 2]).view(2, 1)),
    "cat": (False, lambda d, h: torch.cat([d([1.0]), h([2.0])])),
    "index by a CPU long tensor": (True, lambda d, h: d([1.0, 2, 3])[h([0.0, 2]).long()]),
    "index a CPU tensor by a device one": (False, lambda d, h: h([1.0, 2, 3])[d([0.0, 2]).long()]),
    "gather with CPU ids": (False, lambda d, h: d([1.0, 2, 3]).gather(0, h([0.0, 2]).long())),
    "masked_fill with a CPU mask": (False, lambda d, h: d([1.0, 2, 3]).masked_fill(h([1.0, 0, 1]).bool(), 0.0)),
    "where with a CPU [3]": (False, lambda d, h: torch.where(d([1.0, 0, 1]).bool(), d([1.0, 2, 3]), h([4.0, 5, 6]))),
    "copy_ from the CPU": (True, lambda d, h: d([1.0, 2, 3]).copy_(h([4.0, 5, 6]))),
    "copy_ to the CPU": (True, lambda d, h: h([1.0, 2, 3]).copy_(d([4.0, 5, 6]))),
    "slice assignment from the CPU": (True, lambda d, h: d([1.0, 2, 3]).__setitem__(slice(0, 2), h([4.0, 5]))),
    "slice assignment into the CPU": (True, lambda d, h: h([1.0, 2, 3]).__setitem__(slice(0, 2), d([4.0, 5]))),
    "assignment at CPU indices of device values": (
        True,
        lambda d, h: d([1.0, 2, 3]).__setitem__(h([0.0, 2]).long(), d([4.0, 5])),
    ),
    "assignment at CPU indices of CPU values": (
        False,
        lambda d, h: d([1.0, 2, 3]).__setitem__(h([0.0, 2]).long(), h([4.0, 5])),
    ),
    "assignment under a CPU mask of a Python number": (
        True,
        lambda d, h: d([1.0, 2, 3]).__setitem__(h([1.0, 0, 1]).bool(), 0.0),
    ),
    "in-place add_ of a CPU [3]": (False, lambda d, h: d([1.0, 2, 3]).add_(h([1.0, 2, 3]))),
    "scatter with CPU ids": (False, lambda d, h: d([1.0, 2, 3]).scatter(0, h([0.0, 2]).long(), d([4.0, 5]))),
    "where with a CPU 0-dim other": (
        True,
        lambda d, h: torch.where(d([1.0, 0, 1]).bool(), d([1.0, 2, 3]), torch.tensor(0.0)),
    ),
    "factory on x.device, then add": (True, lambda d, h: d([1.0, 2, 3]) + torch.arange(3, device=d([0.0]).device)),
    "factory without device, then add": (False, lambda d, h: d([1.0, 2, 3]) + torch.arange(3)),
    ".to(x.device), then add": (True, lambda d, h: d([1.0, 2, 3]) + h([1.0, 2, 3]).to(d([0.0]).device)),
    ".cpu(), then add a CPU tensor": (True, lambda d, h: d([1.0, 2, 3]).cpu() + h([1.0, 2, 3])),
    ".numpy()": (False, lambda d, h: d([1.0, 2, 3]).numpy()),
    ".item() and .tolist()": (True, lambda d, h: (d([1.0]).item(), d([1.0, 2]).tolist())),
}


def accepts(pattern: Callable, device_tensor: Callable, host_tensor: Callable) -> bool:
    """Whether pattern runs (True) or raises a device error (False); any other error propagates."""
    try:
        pattern(device_tensor, host_tensor)
    except (RuntimeError, TypeError) as exc:
        text = str(exc)
        if "device" in text or "cuda" in text:
            return False
        raise
    return True


def standin_accepts(pattern: Callable) -> bool:
    with on_standin_device():
        return accepts(pattern, lambda v: to_device(torch.tensor(v)), lambda v: torch.tensor(v))
