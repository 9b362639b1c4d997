"""Where a TLX kernel runs: the execution targets of the TLX launchers.

A TLX launcher never calls ``kernel[grid](...)`` itself: it asks :func:`target_for` for the target of its
tensors' device and launches through it. CUDA tensors run on the GPU (the native target, built lazily
from torch's device queries, never at import). Any other device type runs only where a target has been
registered for it: the TLX simulator (``jfa.sim``) registers one for CPU tensors, so the same launchers,
tile lists and dispatch run unchanged on a machine without a GPU. The product never imports the
simulator; the harness registers it (dependency inversion, so ``jfa.kernels`` stays free of ``jfa.sim``).

A target answers four questions: the compute capability its kernels are built for (the dispatch's
``sm_90`` / ``sm_100`` check), how many SMs a persistent grid may fill, whether its kernels may schedule
themselves with cluster launch control, and how to launch. A launcher
that repeats one kind of launch (``jfa.plans``) asks :func:`prepare` for it once: on the GPU the compiled
kernel bound to its arguments (``jfa.kernels.launch.Prepared``), elsewhere the same launch through the
target with the arguments replaced (``jfa.kernels.launch.Relaunch``), so both run the same launcher code.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Callable, Optional

import torch

from jfa.kernels.launch import launch as launch_compiled
from jfa.kernels.launch import Relaunch, prepare_or_relaunch

LaunchFn = Callable[[object, tuple, tuple, dict], None]  # (kernel, grid, args, kwargs)
# Whether the toolchain lowers TLX's cluster launch control for sm_100a. Triton 3.8 with uTLX 3.8.0.post16 does
# not: uTLX emits ttng.async_clc_try_cancel / ttng.clc_query_cancel, ops of the TLX fork's Triton that Triton 3.8
# never registered, so a CLC build fails to compile and a GPU launch runs the static schedule instead.
# tests/test_tlx_compile.py compiles the CLC build and fails once it does compile: then set this True.
TOOLCHAIN_LOWERS_CLC = False
# Whether the toolchain builds clusters of CTAs with 2-CTA tcgen05 MMAs (cta_group::2) for sm_100a. Triton 3.8 with
# uTLX 3.8.0.post16 does not: uTLX's async_dot(two_ctas=True) checks TLX's per-CTA shapes (B holds N / 2 columns)
# while Triton 3.8's tc_gen5_mma verifier wants the accumulator's N equal to B's; tlx.remote_view (every remote
# arrive) raises NotImplementedError (no mapa.shared::cluster upstream); tlx.cluster_barrier fails to parse
# (ttg.num-ctas is set after TTIR). tests/test_tlx_compile.py compiles a 2-CTA MMA and fails once it builds.
TOOLCHAIN_LOWERS_TWO_CTA = False


@dataclass(frozen=True)
class LaunchTarget:
    """An execution target for TLX kernels on one device type."""

    name: str  # shown in dispatch reports: "cuda", "tlx-sim"
    capability: tuple  # (major, minor) of the architecture the kernels are dispatched for
    sm_count: int  # CTAs a persistent grid launches at most
    launch: LaunchFn  # runs ``kernel[grid](*args, **kwargs)``
    cluster_launch_control: bool = False  # sm_100 kernels take their next work item from CLC (one CTA per item)
    # (kernel, args, kwargs, replaced names) -> a prepared launch; None: a ``Relaunch`` through ``launch``
    prepare: Optional[Callable] = None
    # the Blackwell backward runs its 2-CTA dK/dV build (clusters of two CTAs, dK and dV as cta_group::2 MMAs):
    # only a simulator asked for it does; no GPU target picks it (never run on a B200: docs/blackwell.md)
    cta_pair_backward: bool = False


_registered: dict = {}  # device type -> LaunchTarget (the non-CUDA targets)
_cuda_targets: dict = {}  # device index -> LaunchTarget, built at the first launch on that GPU
_lock = threading.Lock()


def register_target(device_type: str, target: Optional[LaunchTarget]) -> Optional[LaunchTarget]:
    """Make ``target`` the target of tensors on ``device_type`` (None removes it); returns the previous
    one, so a scope can put it back. CUDA's target is the GPU itself and cannot be replaced."""
    if device_type == "cuda":
        raise ValueError("register_target: 'cuda' tensors always run on the GPU")
    with _lock:
        previous = _registered.get(device_type)
        if target is None:
            _registered.pop(device_type, None)
        else:
            _registered[device_type] = target
    return previous


def _cuda_launch(kernel, grid, args, kwargs) -> None:
    launch_compiled(kernel, grid, *args, **kwargs)


def _cuda_target(device: torch.device) -> LaunchTarget:
    index = device.index if device.index is not None else torch.cuda.current_device()
    target = _cuda_targets.get(index)
    if target is None:
        props = torch.cuda.get_device_properties(index)
        target = _cuda_targets[index] = LaunchTarget("cuda", (props.major, props.minor), props.multi_processor_count,
                                                     _cuda_launch, TOOLCHAIN_LOWERS_CLC and props.major >= 10,
                                                     prepare_or_relaunch)
    return target


def target_for(device: torch.device) -> Optional[LaunchTarget]:
    """The target that runs TLX kernels on ``device``'s tensors, or None (no GPU, no simulator)."""
    if device.type == "cuda":
        return _cuda_target(device)
    return _registered.get(device.type)


def launch(kernel, grid: tuple, device: torch.device, *args, **kwargs) -> None:
    """Run ``kernel[grid](*args, **kwargs)`` on the target of ``device``; ValueError where there is none."""
    target = target_for(device)
    if target is None:
        raise ValueError(f"no TLX execution target for {device.type} tensors (CUDA runs on the GPU; "
                         "the TLX simulator registers one for CPU tensors: jfa.sim)")
    target.launch(kernel, grid, args, kwargs)


def prepare(kernel, device: torch.device, args: tuple, kwargs: dict, replaced: tuple):
    """The launch ``kernel[grid](*args, **kwargs)`` on ``device``'s target, prepared for repeats in which the
    parameters named in ``replaced`` change (``run(grid, values) -> bool``; False: launch the usual way).
    Call it after the launch itself ran once (a GPU launch then has its binary kept)."""
    target = target_for(device)
    if target is None:
        raise ValueError(f"no TLX execution target for {device.type} tensors")
    if target.prepare is not None:
        return target.prepare(kernel, args, kwargs, replaced)
    return Relaunch(target.launch, kernel, args, kwargs, replaced)
