"""Keep Triton's generic software pipeliner off the TLX kernels, so their wgmma waits are the ones written.

Fork TLX tags a TLX module ``triton.skip_generic_pipeline`` and its pipeliners return early on it. uTLX
(the plugin this project builds with) runs stock Triton's ``make_ttgir`` on NVIDIA, whose pipeline pass
inserts ``warp_group_dot_wait {pendings = 0}`` right after every async dot it does not pipeline itself.
The effect, read off the PTX of every TLX kernel here: each ``wgmma.commit_group`` is followed by
``wgmma.wait_group 0``, so a consumer never has an MMA in flight while it computes (the forward's
QK(j) never overlaps PV(j-1); the dK/dV kernel's S^T and dP^T run one after the other). The
``tlx.async_dot_wait(n, ...)`` counts in the source do nothing.

With own waits a compile of a TLX module skips the generic latency assignment, loop scheduling and
pipelining (the kernels pipeline by hand: TMA rings, mbarriers, explicit waits), and the PTX waits follow
the source (``commit, commit, wait 1, wait 0``). ptxas reports no serialisation (C7513) and no spill for
these builds (offline gate).

What ships (``JFA_TLX_OWN_WAITS`` unset): own waits for the dK/dV kernel (``DEFAULT``), the generic
pipeliner for the forward. The switch takes 0 (no kernel), 1 (every TLX kernel) or TLX kernel names,
comma-separated (``JFA_TLX_OWN_WAITS=jagged_fwd_tlx_kernel``). On the H200: the forward ran 1-10% slower
with own waits (session 5); the dK/dV kernel +0.6 to +3.8% on seven of the eight gem ablation shapes
and -0.9 and +0.3% on the dense one, both builds timed in turn in one process, twice (session 9, 2026-11-30;
``gpu_check bwd-ablation`` column "generic pipeliner (dK/dV)" times the other build).

Installed once (``install()``, idempotent) as a wrapper around whatever stages hook is set (uTLX's);
the setting is part of the compilation cache key, so builds under different settings never share a
cache entry.
"""
from __future__ import annotations

import contextlib
import os

from jfa.flags import env_flag

ENV = "JFA_TLX_OWN_WAITS"
# the TLX kernels the switch can name (the entry function of each compiled module)
KERNELS = ("jagged_fwd_tlx_kernel", "jagged_dkdv_tlx_kernel")
DEFAULT = frozenset({"jagged_dkdv_tlx_kernel"})  # what ships: the kernels that skip the generic pipeliner
_SKIPPED_PASSES = ("add_assign_latencies", "add_schedule_loops", "add_pipeline")
_installed = False


def _setting():
    """True (every TLX kernel), False, or the frozenset of kernel names ``JFA_TLX_OWN_WAITS`` selects
    (DEFAULT when unset or empty). A value that is neither a boolean (``jfa.flags``) nor a list of KERNELS
    raises ValueError."""
    text = os.environ.get(ENV, "")
    if not text.strip():
        return DEFAULT
    try:
        return env_flag(ENV, False)
    except ValueError:
        names = frozenset(n.strip() for n in text.split(",") if n.strip())
        if not names or names - set(KERNELS):
            raise ValueError(f"{ENV}: must be 0, 1, true, false or comma-separated TLX kernel names "
                             f"{KERNELS}, got {text!r}") from None
        return names


def enabled(kernel: str = None) -> bool:
    """Whether TLX compiles skip the generic pipeliner (read at each compile): for ``kernel`` (an entry
    function name), or, without it, for any kernel."""
    setting = _setting()
    if isinstance(setting, bool):
        return setting
    return kernel in setting if kernel is not None else True


@contextlib.contextmanager
def own_waits(on=True):
    """Set ``JFA_TLX_OWN_WAITS`` for the duration of a block (offline compile gate, measurements): True,
    False, one of KERNELS, or None (unset: what ships). Launches inside the block compile (or find
    cached) the builds of that setting: it is part of the cache key, so one process can time both builds
    in turn."""
    saved = os.environ.get(ENV)
    if on is None:
        os.environ.pop(ENV, None)
    else:
        os.environ[ENV] = on if isinstance(on, str) else ("1" if on else "0")
    try:
        _setting()  # a name outside KERNELS raises here, with the environment restored
        yield
    finally:
        if saved is None:
            os.environ.pop(ENV, None)
        else:
            os.environ[ENV] = saved


@contextlib.contextmanager
def _without_generic_pipeline():
    from triton._C.libtriton import passes

    saved = {name: getattr(passes.ttgpuir, name) for name in _SKIPPED_PASSES}
    try:
        for name in saved:
            setattr(passes.ttgpuir, name, lambda *args, **kwargs: None)
        yield
    finally:
        for name, fn in saved.items():
            setattr(passes.ttgpuir, name, fn)


def _is_tlx_module(mod) -> bool:
    from utlx_plugin.custom_stages import is_tlx_module

    return is_tlx_module(mod)


def install() -> None:
    """Wrap the current Triton stages hook (once per process). Does nothing without uTLX."""
    global _installed
    if _installed:
        return
    try:
        from triton import knobs
    except ImportError:  # pragma: no cover - Triton is a dependency
        return
    inner = knobs.runtime.add_stages_inspection_hook
    if inner is None:  # no uTLX: there are no TLX kernels to compile
        return

    def hook(self=None, stages=None, options=None, language=None, capability=None):
        key, digest = inner(self, stages, options, language, capability)
        setting = _setting()
        flag = ("1" if setting else "0") if isinstance(setting, bool) else "+".join(sorted(setting))
        if stages is not None and setting and "ttgir" in stages and getattr(self, "name", "") != "amd":
            make_ttgir = stages["ttgir"]

            def ttgir(src, metadata):
                if _is_tlx_module(src) and enabled(src.get_entry_func_name()):
                    with _without_generic_pipeline():
                        return make_ttgir(src, metadata)
                return make_ttgir(src, metadata)

            stages["ttgir"] = ttgir
        return f"{key}\njfa-own-waits={flag}", f"{digest}-jfa-own-waits-{flag}"

    knobs.runtime.add_stages_inspection_hook = hook
    _installed = True
