"""Launching a jitted Triton kernel on a GPU with the host work a launch needs, and no more.

``kernel[grid](*args, **kwargs)`` does, at every launch, what only a kernel's first launch of a kind
needs: it binds the arguments (a generated ``inspect`` binder), asks Triton's native specialiser for
every argument's type and alignment (the largest host cost of a jfa call on the H200: NOTES.md, session
17), builds and hashes the cache key, asks the stages hook (uTLX, ``jfa.kernels.tlx.pipeline``) for its
part of that key, and only then finds the compiled kernel. :func:`launch` keeps, per kernel, the
compiled kernel of each *launch signature* and launches it directly.

A launch signature is everything that can change which binary Triton picks, computed with plain
Python reads: the current device; the compile options; each constexpr's value; each other argument's
kind (a tensor's dtype and whether its address is 16-byte aligned; an int's Triton type and whether it
is 1 or a multiple of 16; a tensor descriptor's dtype, block shape and padding; a float's type); and
the build settings of ``jfa.kernels.tlx.pipeline``. It separates whatever Triton specialises on
(``tests/test_launch.py`` checks that launches with one signature always bind to one Triton
specialisation), so one signature never stands for two binaries; the first launch of each goes through
Triton (compiling if needed) and its compiled kernel is kept. Triton's debug and instrumentation
settings are not part of it: they are process settings for debugging, not switched between launches.

What keeps a launch on Triton's own path, always: an interpreted kernel (Triton's CPU interpreter, the
TLX simulator), Triton's launch, compile or cache hooks set (profilers, the offline compile gate), a
cluster launch (``num_ctas`` or uTLX's ``ctas_per_cga``, which rescale the grid inside Triton's path), an
argument of a kind the signature does not describe, or an unhashable constexpr.
"""
from __future__ import annotations

import inspect
from typing import Optional

import torch

_I32_MIN, _I32_MAX, _I64_MAX = -2**31, 2**31 - 1, 2**63 - 1
_COMPILED: dict = {}  # id(kernel) -> _KernelLaunches
_UNDESCRIBED = object()  # a parameter no argument was given for (yet)


_SPECIALISED, _TYPED, _CONSTEXPR = 0, 1, 2  # how Triton treats a parameter's value


class _KernelLaunches:
    """One kernel's parameters (names, how Triton treats each, defaults) and its compiled kernels by
    launch signature."""

    def __init__(self, kernel):
        self.kernel = kernel
        self.names = tuple(p.name for p in kernel.params)
        self.index = {name: i for i, name in enumerate(self.names)}
        self.treatment = tuple(_CONSTEXPR if p.is_constexpr else _TYPED if p.do_not_specialize else _SPECIALISED
                               for p in kernel.params)
        self.defaults = tuple(p.default for p in kernel.params)
        self.compiled: dict = {}

    def bind(self, args: tuple, kwargs: dict) -> Optional[tuple]:
        """(every parameter's value in order, the compile options), or None where Triton would refuse the
        call (a parameter missing or given twice, too many arguments: it then raises its own error)."""
        if len(args) > len(self.names):
            return None
        values = list(args) + [_UNDESCRIBED] * (len(self.names) - len(args))
        options = []
        for name, value in kwargs.items():
            i = self.index.get(name)
            if i is None:
                options.append((name, value))
            elif i < len(args):  # given twice
                return None
            else:
                values[i] = value
        if len(args) + len(kwargs) - len(options) < len(values):
            for i, value in enumerate(values):
                if value is _UNDESCRIBED:
                    default = self.defaults[i]
                    if default is inspect.Parameter.empty:
                        return None
                    values[i] = default
        return values, tuple(options)

    def signature(self, values: list, options: tuple, device: int) -> Optional[tuple]:
        """The launch signature (the module docstring), or None for an argument it does not describe.
        Ints: their Triton type (i32, i64, u64), and unless never specialised, value 1 and divisibility by
        16; tensors: dtype and 16-byte alignment; floats and bools: their type; constexprs: their value."""
        from jfa.kernels.tlx import pipeline

        key = [device, options, pipeline.build_settings()]
        for value, treatment in zip(values, self.treatment):
            kind = describe(value, treatment)
            if kind is _UNDESCRIBED:
                return None
            key.append(kind)
        return tuple(key)


def describe(value, treatment: int):
    """What the launch signature records of one argument (the module docstring), ``_UNDESCRIBED`` for a
    kind it does not describe."""
    if treatment == _CONSTEXPR:
        return value
    cls = value.__class__
    if cls is int:
        width = 0 if _I32_MIN <= value <= _I32_MAX else (1 if value <= _I64_MAX else 2)
        return width if treatment == _TYPED else (width, value == 1, value % 16 == 0)
    if isinstance(value, torch.Tensor):
        return value.dtype, value.data_ptr() % 16 == 0
    if value is None or cls is float or cls is bool:
        return cls
    if cls.__name__ == "TensorDescriptor":
        return value.base.dtype, *value.block_shape, value.padding, value.round_f32_to_tf32
    return _UNDESCRIBED


def _set(hook) -> bool:
    """Whether a Triton hook does anything (the launch hooks are chains, empty unless a profiler adds one)."""
    return hook is not None and (bool(hook.calls) if hasattr(hook, "calls") else True)


def _hooks_set() -> bool:
    from triton import knobs as triton_knobs

    runtime = triton_knobs.runtime
    return (_set(runtime.launch_enter_hook) or _set(runtime.launch_exit_hook) or _set(runtime.jit_cache_hook)
            or _set(runtime.jit_post_compile_hook))


def _driver():
    from triton.runtime.driver import driver

    return driver.active


def launch(kernel, grid: tuple, *args, **kwargs) -> None:
    """``kernel[grid](*args, **kwargs)``; a launch whose signature was launched before skips Triton's
    binding and specialisation and launches the compiled kernel kept from then (the module docstring)."""
    if (not hasattr(kernel, "params") or not hasattr(kernel, "device_caches") or "ctas_per_cga" in kwargs
            or kwargs.get("num_ctas", 1) != 1 or _hooks_set()):
        kernel[grid](*args, **kwargs)  # (the module docstring says why these take Triton's own path)
        return
    launches = _COMPILED.get(id(kernel))
    if launches is None or launches.kernel is not kernel:
        launches = _COMPILED[id(kernel)] = _KernelLaunches(kernel)
    bound = launches.bind(args, kwargs)
    if bound is None:
        kernel[grid](*args, **kwargs)
        return
    values, options = bound
    driver = _driver()
    device = driver.get_current_device()
    key = launches.signature(values, options, device)
    try:
        compiled = launches.compiled.get(key) if key is not None else None
    except TypeError:  # an unhashable constexpr: Triton's own path, every time
        compiled = key = None
    if compiled is None:
        compiled = kernel[grid](*args, **kwargs)
        if key is not None and compiled is not None:
            launches.compiled[key] = compiled
        return
    grid_y = grid[1] if len(grid) > 1 else 1
    grid_z = grid[2] if len(grid) > 2 else 1
    compiled.run(grid[0], grid_y, grid_z, driver.get_current_stream(device), compiled.function,
                 compiled.packed_metadata, None, None, None, *values)


class Prepared:
    """A launch of one kernel bound once, for a caller that repeats the same kind of launch with some
    arguments replaced (``jfa.plans``: fresh outputs, the descriptors of new inputs). :meth:`run` puts the
    replacements in, checks that each keeps what the launch signature records of its argument (so the
    kept binary is the one Triton would pick) and launches it. The caller keeps every other argument's
    value, and the settings in force when it was prepared, unchanged (its cache key covers them)."""

    __slots__ = ("launches", "compiled", "values", "slots", "kinds", "device")

    def __init__(self, launches: _KernelLaunches, compiled, values: list, replaced: tuple, device: int):
        self.launches, self.compiled, self.values, self.device = launches, compiled, values, device
        self.slots = tuple(launches.index[name] for name in replaced)
        self.kinds = tuple(describe(values[i], launches.treatment[i]) for i in self.slots)

    def run(self, grid: tuple, replacements: tuple) -> bool:
        """Launch with ``replacements`` (the values of the names given to :func:`prepare`, in order); False,
        launching nothing, when one of them changes the signature, the current device is another, or a
        Triton hook is set: the caller then launches the usual way."""
        values = self.values.copy()
        treatment = self.launches.treatment
        for slot, kind, value in zip(self.slots, self.kinds, replacements):
            if describe(value, treatment[slot]) != kind:
                return False
            values[slot] = value
        driver = _driver()
        device = driver.get_current_device()
        if device != self.device or _hooks_set():
            return False
        grid_y = grid[1] if len(grid) > 1 else 1
        grid_z = grid[2] if len(grid) > 2 else 1
        self.compiled.run(grid[0], grid_y, grid_z, driver.get_current_stream(device), self.compiled.function,
                          self.compiled.packed_metadata, None, None, None, *values)
        return True


def prepare(kernel, args: tuple, kwargs: dict, replaced: tuple) -> Optional[Prepared]:
    """The launch ``kernel[grid](*args, **kwargs)`` bound for :meth:`Prepared.run` with the parameters named
    in ``replaced`` replaced, or None where :func:`launch` would not launch it directly, or its binary is
    not kept yet (launch it once first)."""
    if (not hasattr(kernel, "params") or "ctas_per_cga" in kwargs or kwargs.get("num_ctas", 1) != 1
            or _hooks_set()):
        return None
    launches = _COMPILED.get(id(kernel))
    if launches is None or launches.kernel is not kernel:
        return None
    bound = launches.bind(args, kwargs)
    if bound is None:
        return None
    values, options = bound
    device = _driver().get_current_device()
    key = launches.signature(values, options, device)
    try:
        compiled = launches.compiled.get(key) if key is not None else None
    except TypeError:
        return None
    if compiled is None:
        return None
    return Prepared(launches, compiled, values, replaced, device)


class Relaunch:
    """A prepared launch without the direct path (an interpreted kernel, the simulator's target, a launch
    :func:`prepare` refuses): :meth:`run` launches through ``launch_fn(kernel, grid, args, kwargs)`` with the
    named arguments replaced, exactly as the first launch went."""

    __slots__ = ("launch_fn", "kernel", "args", "kwargs", "replaced")

    def __init__(self, launch_fn, kernel, args: tuple, kwargs: dict, replaced: tuple):
        self.launch_fn, self.kernel, self.args, self.kwargs = launch_fn, kernel, tuple(args), dict(kwargs)
        position = {name: i for i, name in enumerate(kernel.arg_names)}
        # the position in args, or the keyword, of each replaced parameter
        self.replaced = tuple(position[name] if position[name] < len(args) else name for name in replaced)

    def run(self, grid: tuple, replacements: tuple) -> bool:
        args, kwargs = list(self.args), dict(self.kwargs)
        for where, value in zip(self.replaced, replacements):
            if where.__class__ is int:
                args[where] = value
            else:
                kwargs[where] = value
        self.launch_fn(self.kernel, grid, tuple(args), kwargs)
        return True


def _launch_with(kernel, grid, args, kwargs) -> None:
    launch(kernel, grid, *args, **kwargs)


def prepare_or_relaunch(kernel, args: tuple, kwargs: dict, replaced: tuple):
    """:func:`prepare`'s direct launch where it can be made, else a :class:`Relaunch` through :func:`launch`."""
    return prepare(kernel, args, kwargs, replaced) or Relaunch(_launch_with, kernel, args, kwargs, replaced)


def clear() -> None:
    """Forget every kept compiled kernel (tests; Triton's own caches are untouched)."""
    _COMPILED.clear()
