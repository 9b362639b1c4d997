"""Compile switches of the TLX builds: Triton's generic software pipeliner kept off a TLX kernel (so its
wgmma waits are the ones written), and a kernel's LLVM IR left to ptxas.

Own waits. Fork TLX tags a TLX module ``triton.skip_generic_pipeline`` and its pipeliners return early on
it. uTLX (the plugin this project builds with) runs stock Triton's ``make_ttgir`` on NVIDIA, whose pipeline
pass inserts ``warp_group_dot_wait {pendings = 0}`` right after every async dot it does not pipeline
itself: each ``wgmma.commit_group`` is then followed by ``wgmma.wait_group 0``, so a consumer never has an
MMA in flight while it computes, and the ``tlx.async_dot_wait(n, ...)`` counts in the source do nothing.
With own waits a compile of a TLX module skips the generic latency assignment, loop scheduling and
pipelining (the kernels pipeline by hand: TMA rings, mbarriers, explicit waits), and the PTX waits follow
the source (``commit, commit, wait 1, wait 0``). What ships (``knobs.tlx_own_waits``, ``JFA_TLX_OWN_WAITS``):
own waits for the dK/dV kernel, the generic pipeliner for the forward (measured: NOTES.md).

LLVM O0. LLVM's loop-invariant code motion lifts every per-thread shared-memory address (the swizzled
stmatrix, stage and statistics offsets, computed from %tid) out of a persistent kernel's loops to its
entry; at 240 registers per consumer ptxas then spills them to the stack. Skipping LLVM's optimisation
pipeline (its NVPTX code generation still runs) leaves that to ptxas (-O3), which keeps them where they
are used. A build asks for it through its config (its launcher wraps the launch in ``build_llvm_o0``);
``knobs.tlx_llvm_o0`` (``JFA_TLX_LLVM_O0``), when set, overrides every build.

Own partition registers. On sm_100 stock ``make_ttgir`` runs ``optimize_partition_warps``, which re-estimates
every warp-specialised partition's registers and overwrites the ``registers=`` a TLX source states (the
Blackwell forward's softmax warpgroups asked for 192 and got 88, and spilled). TLX modules skip it: their
partitions' warps and registers are the source's, as on sm_90, where Triton never runs that pass.

Installed once (``install()``, idempotent) as a wrapper around whatever stages hook is set (uTLX's);
both settings are part of the compilation cache key, so builds under different settings never share a
cache entry, and one process can time both builds in turn.
"""
from __future__ import annotations

import contextlib
import contextvars

from jfa import knobs

_SKIPPED_PASSES = ("add_assign_latencies", "add_schedule_loops", "add_pipeline")
_REGISTER_PASSES = ("add_optimize_partition_warps",)  # skipped for every TLX module (own partition registers)
# the kernels whose current launch's build asks for its LLVM IR to go unoptimised (set by build_llvm_o0 in
# the launching thread, where Triton compiles)
_build_llvm_o0: contextvars.ContextVar = contextvars.ContextVar("jfa_build_llvm_o0", default=frozenset())
_installed = False


def _selects(setting, kernel) -> bool:
    if isinstance(setting, bool):
        return setting
    return kernel in setting if kernel is not None else bool(setting)


def enabled(kernel: str = None) -> bool:
    """Whether TLX compiles skip the generic pipeliner (read at each compile): for ``kernel`` (an entry
    function name), or, without it, for any kernel."""
    return _selects(knobs.tlx_own_waits, kernel)


def _llvm_o0_setting():
    """``knobs.tlx_llvm_o0`` when set; else the kernels the current launch's build asks for."""
    setting = knobs.tlx_llvm_o0
    return _build_llvm_o0.get() if setting is None else setting


def build_settings() -> tuple:
    """Both settings as the stages hook adds them to Triton's cache key (``install``): launches under
    other settings compile other binaries (``jfa.kernels.launch`` keys its kept kernels by it)."""
    return _flag(knobs.tlx_own_waits), _flag(_llvm_o0_setting())


def llvm_o0(kernel: str) -> bool:
    """Whether a TLX compile of ``kernel`` now skips LLVM's optimisation (read at each compile)."""
    return _selects(_llvm_o0_setting(), kernel)


@contextlib.contextmanager
def build_llvm_o0(kernel: str, wanted: bool):
    """Around a launch of ``kernel``: its build's config asks (``wanted``) for its LLVM IR to be left to
    ptxas. ``knobs.tlx_llvm_o0``, when set, still decides (measurements). The request is seen by compiles
    in the launching thread (Triton's synchronous JIT, which the library uses); Triton's asynchronous
    compile mode, which compiles in worker threads, would not see it."""
    token = _build_llvm_o0.set(frozenset({kernel}) if wanted else frozenset())
    try:
        yield
    finally:
        _build_llvm_o0.reset(token)


# Inside one compile (the thread that runs it): skip the generic pipeliner's passes / run LLVM's
# optimisation at O0. Triton's functions are wrapped once, for good (``_wrap_triton_once``), and the
# wrappers read these flags: a compile in another thread at the same moment is untouched (swapping the
# module attributes in and out for each compile raced with it).
_in_own_waits_compile: contextvars.ContextVar = contextvars.ContextVar("jfa_own_waits_compile", default=False)
_in_llvm_o0_compile: contextvars.ContextVar = contextvars.ContextVar("jfa_llvm_o0_compile", default=False)
_in_tlx_ttgir_compile: contextvars.ContextVar = contextvars.ContextVar("jfa_tlx_ttgir_compile", default=False)


@contextlib.contextmanager
def _flag_set(flag: contextvars.ContextVar):
    token = flag.set(True)
    try:
        yield
    finally:
        flag.reset(token)


def _llvm_at_o0():
    """make_llir's ``llvm.optimize_module`` runs at O0 inside the block (this thread's compile only).
    Only LLVM's optimisation pipeline is skipped; its NVPTX code generation still runs in make_ptx."""
    return _flag_set(_in_llvm_o0_compile)


def _without_generic_pipeline():
    """The generic pipeliner's passes do nothing inside the block (this thread's compile only)."""
    return _flag_set(_in_own_waits_compile)


def _own_partition_registers():
    """optimize_partition_warps does nothing inside the block (this thread's compile only)."""
    return _flag_set(_in_tlx_ttgir_compile)


def _wrap_triton_once() -> None:
    from triton._C.libtriton import llvm, passes

    if not getattr(llvm.optimize_module, "_jfa_wrapped", False):
        optimize = llvm.optimize_module

        def optimize_module(mod, level, *args, **kwargs):
            return optimize(mod, llvm.OPTIMIZE_O0 if _in_llvm_o0_compile.get() else level, *args, **kwargs)

        optimize_module._jfa_wrapped = True
        llvm.optimize_module = optimize_module
    for name, flag in [(n, _in_own_waits_compile) for n in _SKIPPED_PASSES] + \
            [(n, _in_tlx_ttgir_compile) for n in _REGISTER_PASSES]:
        add_pass = getattr(passes.ttgpuir, name, None)
        if add_pass is None or getattr(add_pass, "_jfa_wrapped", False):
            continue

        def skippable(*args, _add_pass=add_pass, _flag=flag, **kwargs):
            if _flag.get():
                return None
            return _add_pass(*args, **kwargs)

        skippable._jfa_wrapped = True
        setattr(passes.ttgpuir, name, skippable)


def _is_tlx_module(mod) -> bool:
    from utlx_plugin.custom_stages import is_tlx_module

    return is_tlx_module(mod)


def install() -> None:
    """Wrap the current Triton stages hook (once per process). Does nothing without uTLX."""
    global _installed
    if _installed:
        return
    try:
        from triton import knobs as triton_knobs
    except ImportError:  # pragma: no cover - Triton is a dependency
        return
    inner = triton_knobs.runtime.add_stages_inspection_hook
    if inner is None:  # no uTLX: there are no TLX kernels to compile
        return
    _wrap_triton_once()

    def hook(self=None, stages=None, options=None, language=None, capability=None):
        key, digest = inner(self, stages, options, language, capability)
        setting, o0_setting = knobs.tlx_own_waits, _llvm_o0_setting()
        flag, o0_flag = _flag(setting), _flag(o0_setting)
        nvidia = getattr(self, "name", "") != "amd"
        if stages is not None and nvidia:
            _wrap_stage(stages, "ttgir", lambda _kernel: True, _own_partition_registers)
            if setting:
                _wrap_stage(stages, "ttgir", enabled, _without_generic_pipeline)
            if o0_setting:
                _wrap_stage(stages, "llir", llvm_o0, _llvm_at_o0)
        return (f"{key}\njfa-own-waits={flag}\njfa-llvm-o0={o0_flag}\njfa-own-partition-registers=1",
                f"{digest}-jfa-own-waits-{flag}-jfa-llvm-o0-{o0_flag}-jfa-own-partition-registers")

    triton_knobs.runtime.add_stages_inspection_hook = hook
    _installed = True


def _wrap_stage(stages: dict, name: str, selects, switched) -> None:
    """Run stage ``name`` inside ``switched()`` for the TLX kernels ``selects`` (by entry name) picks."""
    if name not in stages:
        return
    make = stages[name]

    def stage(src, metadata):
        if _is_tlx_module(src) and selects(src.get_entry_func_name()):
            with switched():
                return make(src, metadata)
        return make(src, metadata)

    stages[name] = stage


def _flag(setting) -> str:
    return ("1" if setting else "0") if isinstance(setting, bool) else "+".join(sorted(setting))
