"""Offline compile gate: build the shipped kernels for Hopper (sm_90a) on a machine with no GPU and
check what the hardware will run: the tensor-core instruction is there (wgmma), nothing spills to
local memory, shared memory fits the SM.

Triton compiles to PTX and ptxas (shipped in the triton wheel) assembles the cubin; cuobjdump (also
shipped) reads registers, stack and local memory off the cubin. Needs a process in which triton is
NOT in interpreter mode (``TRITON_INTERPRET`` unset): run ``python -m jfa.fuzz.compile_gate``.
Each target is one kernel with one shipped config and one set of compile-time flags; the runtime
integer arguments are declared 16-divisible, as Triton specialises them at launch for aligned shapes.

Three target sets: the portable Triton kernels (``shipped_targets``), the TLX Hopper kernels (``tlx_targets``,
names ``tlx-...``; ``--backend tlx``) and the TLX Blackwell forward and dK/dV kernels for sm_100a
(``blackwell_targets``, names ``blackwell-...``; ``--backend blackwell``: tcgen05.mma and commits in the PTX, the
forward's CLC try_cancel and query exactly where the toolchain lowers CLC (``TOOLCHAIN_LOWERS_CLC``) and a launch
grid that fits the schedule, tensor memory within 512 columns, shared memory within 227 KB, the partitions' stated
registers, spill limited to the thread indices Triton's lowering computes once at the entry,
``SM100_ENTRY_SPILL_BYTES``). TLX targets get further checks read off the PTX/TTGIR and a ptxas log:
warp-specialised partitions with setmaxnreg, TMA (cp.async.bulk.tensor) loads, mbarrier waits, the pingpong named
barriers, no spill and no wgmma serialisation warning from ptxas; and the arguments its launcher builds are bound
to the kernel (on CPU tensors, stopping before the compile) to check that a real launch specialises to the very
signature compiled here, and for the dK/dV kernel that its launcher asks for the same compile settings (the LLVM
O0 build of ``HopperDkDvConfig.llvm_o0``, read off Triton's cache key).
"""
from __future__ import annotations

import argparse
import contextlib
import inspect
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field, replace

SM90_SHARED_LIMIT = 227 * 1024  # bytes of shared memory one CTA may use on sm_90
SM100_SHARED_LIMIT = 232448  # the same on sm_100 (227 KB)
SM100_TMEM_COLUMNS = 512  # 32-bit tensor-memory columns per SM on sm_100
SHARED_LIMITS = {90: SM90_SHARED_LIMIT, 100: SM100_SHARED_LIMIT}
TENSOR_CORE_OPS = {90: "wgmma.mma_async", 100: "tcgen05.mma"}  # the MMA instruction each architecture must show
# Spill a warp-specialised sm_100 build may show: Triton's lowering computes the thread index and a few values
# derived from it (lane, row, a thread's byte offset) once, at the kernel's entry, for every partition; ptxas
# keeps them in local memory across the partitions' setmaxnreg (stored once at the entry, reloaded where a
# partition uses them). At most four such 32-bit values; anything more is a partition running out of registers.
SM100_ENTRY_SPILL_BYTES = 16
OFFLINE_SM_COUNT = 132  # the SMs of the GPU the offline launch bindings pretend to be


@dataclass
class Target:
    name: str
    kernel: str  # "forward" | "dkdv" | "dq"
    dtype: str
    head_dim: int
    causal: bool
    broadcast_q: bool
    arch: int = 90
    backend: str = "triton"  # "triton": jfa.kernels.triton; "tlx": jfa.kernels.tlx.hopper
    profile: bool = False  # tlx: the timeline (profiling) build
    # tlx: switches of the kernel's ablation study (the forward's ``Variant.parse``, the dK/dV kernel's
    # ``BackwardVariant.parse``), "" = what ships
    switches: str = ""
    fused_dq: bool = False  # tlx dK/dV: the fused dQ's build (False: the deterministic backward's)
    window: bool = False  # tlx: the sliding-window build (the band's offsets as arguments)
    group: int = 1  # tlx: query heads per key/value head (grouped-query attention: one build per group size)
    sparse: bool = False  # tlx: the block-sparse build (lists of key blocks per query block)
    # tlx forward and dK/dV: the MXFP8 build with this rule (E4M3 inputs; ``dtype`` is the output's, the gradients')
    mx: str = ""
    # Blackwell forward: the cluster-launch-control build (True) or the static one (False); None: the one a launch
    # runs (``TOOLCHAIN_LOWERS_CLC``), whose launch binding is then checked too
    clc: object = None
    # Blackwell dK/dV: the 2-CTA build (clusters of two CTAs, dK and dV as tcgen05 cta_group::2 MMAs)
    cta_pair: bool = False

    def window_size(self) -> tuple:
        """The ``window_size`` a launch of this target passes (the band's values do not change the build)."""
        return ((64, 0) if self.causal else (64, 64)) if self.window else (-1, -1)


@dataclass
class Result:
    target: Target
    ok: bool
    problems: list
    registers: int = -1
    stack_bytes: int = -1
    local_bytes: int = -1
    shared_bytes: int = -1
    tensor_core_ops: int = 0
    seconds: float = 0.0
    details: dict = field(default_factory=dict)  # TLX targets: the structure read off PTX/TTGIR/ptxas


def shipped_targets() -> list:
    """One target per kernel x 16-bit config row (D 64, 128) x causal; broadcast-Q on D 128."""
    targets = []
    for head_dim in (64, 128):
        for causal in (False, True):
            for kernel in ("forward", "dkdv", "dq"):
                targets.append(Target(f"{kernel}-bf16-D{head_dim}{'-causal' if causal else ''}", kernel, "bf16",
                                      head_dim, causal, False))
    targets += [Target(f"{k}-bf16-D128-bcastq", k, "bf16", 128, False, True) for k in ("forward", "dkdv", "dq")]
    return targets


def tlx_targets() -> list:
    """The TLX Hopper forward: every shipped config (bf16, fp16 x D 64, 128) x causal x broadcast-Q, the
    builds of its reported ablations and its timeline build; then the dK/dV kernel's."""
    targets = []
    for dtype in ("bf16", "fp16"):
        for head_dim in (64, 128):
            for causal in (False, True):
                for broadcast_q in (False, True):
                    flags = ("-causal" if causal else "") + ("-bcastq" if broadcast_q else "")
                    name = f"tlx-forward-{dtype}-D{head_dim}{flags}"
                    targets.append(Target(name, "forward", dtype, head_dim, causal, broadcast_q, backend="tlx"))
                    if causal:  # long causal sequences take the counter's build (``Variant.for_launch``)
                        targets.append(Target(f"{name}[schedule=dynamic]", "forward", dtype, head_dim, causal,
                                              broadcast_q, backend="tlx", switches="schedule=dynamic"))
    # the ablation builds and the timeline build must compile too (they are measured, never shipped); the
    # other ablations (persistence, LPT order) change the launch, not the build
    for switches in ("pingpong=0", "peel=0"):
        targets.append(Target(f"tlx-forward-bf16-D128-causal[{switches}]", "forward", "bf16", 128, True, False,
                              backend="tlx", switches=switches))
    targets.append(Target("tlx-forward-bf16-D128[profile]", "forward", "bf16", 128, False, False, backend="tlx",
                          profile=True))
    targets.append(Target("tlx-forward-bf16-D64[schedule=dynamic,profile]", "forward", "bf16", 64, False, False,
                          backend="tlx", switches="schedule=dynamic", profile=True))
    targets += _window_and_group_targets("forward")
    targets += _sparse_targets("forward")
    targets += _q_regs_targets()
    targets += mx_targets()
    return targets + tlx_backward_targets() + mx_backward_targets()


def _q_regs_targets() -> list:
    """The ablation builds of the bulk loop's Q operand: the other choice than the config's at each head dim
    (``Variant.q_regs``; D 64 ships Q in registers, D 128 in shared memory), causal with broadcast Q (the
    most live state)."""
    return [Target(f"tlx-forward-bf16-D{d}-causal-bcastq[q_regs={int(d == 128)}]", "forward", "bf16", d, True, True,
                   backend="tlx", switches=f"q_regs={int(d == 128)}") for d in (64, 128)]


def mx_targets() -> list:
    """The TLX MXFP8 forward builds: FLOOR at both head dims (causal, broadcast Q and grouped heads at D 128),
    RCEIL, and fp16 / fp32 outputs (the output type is the build's only dtype). Sliding windows stay on the
    portable MX kernel (``mx_supports``)."""
    def mx(name, dtype="bf16", head_dim=128, causal=False, broadcast_q=False, rule="floor", **kw):
        return Target(f"tlx-forward-mx{rule}-{dtype}-D{head_dim}{name}", "forward", dtype, head_dim, causal,
                      broadcast_q, backend="tlx", mx=rule, **kw)
    return [mx("", head_dim=64), mx("-causal", head_dim=64), mx(""), mx("-causal", causal=True),
            mx("-causal-bcastq", causal=True, broadcast_q=True), mx("-gqa4", group=4), mx("", rule="rceil"),
            mx("", dtype="fp16"), mx("-causal", dtype="fp32", causal=True)]


def mx_backward_targets() -> list:
    """The TLX MXFP8 dK/dV builds (``backward.mx_dkdv_tlx``): FLOOR at both head dims plain and causal; at D 128
    causal broadcast Q, grouped heads (fp32 partials), RCEIL, and fp32 gradients."""
    def mx(name, dtype="bf16", head_dim=128, causal=False, broadcast_q=False, rule="floor", **kw):
        return Target(f"tlx-dkdv-mx{rule}-{dtype}-D{head_dim}{name}", "dkdv", dtype, head_dim, causal, broadcast_q,
                      backend="tlx", mx=rule, **kw)
    return [mx("", head_dim=64), mx("-causal", head_dim=64, causal=True), mx(""), mx("-causal", causal=True),
            mx("-causal-bcastq", causal=True, broadcast_q=True), mx("-gqa4", group=4), mx("", rule="rceil"),
            mx("-causal", dtype="fp32", causal=True)]


def _sparse_targets(kernel: str, fused_dq: bool = False) -> list:
    """The block-sparse builds: bf16 at both head dims, causal and not, fp16 at D 128 causal, broadcast Q at
    D 128 (the dK/dV kernel's with the fused dQ or without it)."""
    suffix = "[fused-dq]" if fused_dq else ""
    prefix = "tlx-forward" if kernel == "forward" else "tlx-dkdv"
    combos = [("bf16", d, c, False) for d in (64, 128) for c in (False, True)]
    combos += [("fp16", 128, True, False), ("bf16", 128, False, True)]
    return [Target(f"{prefix}-{dtype}-D{d}{'-causal' if c else ''}{'-bcastq' if b else ''}-sparse{suffix}", kernel,
                   dtype, d, c, b, backend="tlx", fused_dq=fused_dq, sparse=True) for dtype, d, c, b in combos]


def _window_and_group_targets(kernel: str, fused_dq: bool = False, gqa_head_dim: int = 128) -> list:
    """Sliding windows (D 64, causal at D 128) and grouped-query attention (group 4); the dK/dV kernel's with the
    fused dQ or without it."""
    suffix = "[fused-dq]" if fused_dq else ""
    prefix = "tlx-forward" if kernel == "forward" else "tlx-dkdv"
    return [Target(f"{prefix}-bf16-D64-window{suffix}", kernel, "bf16", 64, False, False, backend="tlx",
                   fused_dq=fused_dq, window=True),
            Target(f"{prefix}-bf16-D128-causal-window{suffix}", kernel, "bf16", 128, True, False, backend="tlx",
                   fused_dq=fused_dq, window=True),
            Target(f"{prefix}-bf16-D{gqa_head_dim}-gqa4{suffix}", kernel, "bf16", gqa_head_dim, False, False,
                   backend="tlx", fused_dq=fused_dq, group=4)]


def tlx_backward_targets() -> list:
    """The TLX Hopper dK/dV kernel: every shipped build (dtype x head dim, with the fused dQ ("[fused-dq]") and
    without it, the deterministic backward's) x causal x broadcast-Q."""
    from jfa.kernels.tlx.hopper.backward import SUPPORTED_HEAD_DIMS

    targets = []
    for dtype in ("bf16", "fp16"):
        for head_dim in SUPPORTED_HEAD_DIMS:
            for fused_dq in (False, True):
                suffix = "[fused-dq]" if fused_dq else ""
                for causal in (False, True):
                    name = f"tlx-dkdv-{dtype}-D{head_dim}{'-causal' if causal else ''}{suffix}"
                    targets.append(Target(name, "dkdv", dtype, head_dim, causal, False, backend="tlx",
                                          fused_dq=fused_dq))
                targets.append(Target(f"tlx-dkdv-{dtype}-D{head_dim}-bcastq{suffix}", "dkdv", dtype, head_dim,
                                      False, True, backend="tlx", fused_dq=fused_dq))
    targets += _window_and_group_targets("dkdv")
    targets += _window_and_group_targets("dkdv", fused_dq=True, gqa_head_dim=64)
    # grouped heads with the fused dQ at D 128 too (the halves' build): causal, and a group of 8 with a
    # broadcast Q (an item's steps run over its group's query heads)
    targets += [Target("tlx-dkdv-bf16-D128-causal-gqa4[fused-dq]", "dkdv", "bf16", 128, True, False, backend="tlx",
                       fused_dq=True, group=4),
                Target("tlx-dkdv-bf16-D128-bcastq-gqa8[fused-dq]", "dkdv", "bf16", 128, False, True, backend="tlx",
                       fused_dq=True, group=8)]
    targets += _sparse_targets("dkdv") + _sparse_targets("dkdv", fused_dq=True)
    # the profiling build (measured, never shipped) of the fused dQ's builds: the producer's at D 64 (static
    # schedule), the halves at D 128 (causal: the counter's)
    targets += [Target("tlx-dkdv-bf16-D64[fused-dq,profile]", "dkdv", "bf16", 64, False, False, backend="tlx",
                       fused_dq=True, profile=True),
                Target("tlx-dkdv-bf16-D128-causal[fused-dq,profile]", "dkdv", "bf16", 128, True, False,
                       backend="tlx", fused_dq=True, profile=True)]
    # two K/V slot pairs (the next item's K, V and first query tiles loaded during this one: what ships where a
    # dense launch's items are short, ``BackwardVariant.item_prefetch``), the producer's-dQ build at D 64: every
    # dense build short items take (both dtypes, causal's counter, a broadcast Q, grouped heads), its profiling
    # build, and the ablation's block-sparse and window builds
    pre = "item_prefetch=always"
    targets += [Target(f"tlx-dkdv-{dtype}-D64{name}[fused-dq,{pre}]", "dkdv", dtype, 64, causal, bcast,
                       backend="tlx", fused_dq=True, switches=pre)
                for dtype in ("bf16", "fp16")
                for name, causal, bcast in (("", False, False), ("-causal", True, False), ("-bcastq", False, True))]
    targets += [Target(f"tlx-dkdv-bf16-D64[fused-dq,{pre},profile]", "dkdv", "bf16", 64, False, False,
                       backend="tlx", fused_dq=True, switches=pre, profile=True),
                Target(f"tlx-dkdv-bf16-D64-causal-sparse[fused-dq,{pre}]", "dkdv", "bf16", 64, True, False,
                       backend="tlx", fused_dq=True, switches=pre, sparse=True),
                Target(f"tlx-dkdv-bf16-D64-window[fused-dq,{pre}]", "dkdv", "bf16", 64, False, False,
                       backend="tlx", fused_dq=True, switches=pre, window=True),
                Target(f"tlx-dkdv-fp16-D64-bcastq-gqa4[fused-dq,{pre}]", "dkdv", "fp16", 64, False, True,
                       backend="tlx", fused_dq=True, switches=pre, group=4)]
    return targets


def blackwell_targets() -> list:
    """The TLX Blackwell forward (sm_100a): every shipped config (bf16, fp16 x D 64, 128) x causal x broadcast-Q,
    and grouped key/value heads (group 4)."""
    targets = []
    for dtype in ("bf16", "fp16"):
        for head_dim in (64, 128):
            for causal in (False, True):
                for broadcast_q in (False, True):
                    flags = ("-causal" if causal else "") + ("-bcastq" if broadcast_q else "")
                    targets.append(Target(f"blackwell-forward-{dtype}-D{head_dim}{flags}", "forward", dtype, head_dim,
                                          causal, broadcast_q, arch=100, backend="tlx"))
    targets.append(Target("blackwell-forward-bf16-D128-causal-gqa4", "forward", "bf16", 128, True, False, arch=100,
                          backend="tlx", group=4))
    return targets + blackwell_backward_targets()


def blackwell_clc_targets() -> list:
    """The Blackwell forward's cluster-launch-control build (bf16, D 128 causal, the fullest), compiled whatever
    ``TOOLCHAIN_LOWERS_CLC`` says: whether the toolchain lowers CLC (``--backend blackwell-clc``, not in 'all')."""
    return [Target("blackwell-forward-bf16-D128-causal-clc", "forward", "bf16", 128, True, False, arch=100,
                   backend="tlx", clc=True)]


def blackwell_two_cta_targets() -> list:
    """The Blackwell dK/dV kernel's 2-CTA build (bf16, D 128 causal, fused dQ), compiled whatever
    ``TOOLCHAIN_LOWERS_TWO_CTA`` says: whether the toolchain builds it (``--backend blackwell-2cta``, not in 'all');
    where it does, its PTX must hold ``tcgen05.mma.cta_group::2``."""
    return [Target("blackwell-dkdv-bf16-D128-causal-2cta[fused-dq]", "dkdv", "bf16", 128, True, False, arch=100,
                   backend="tlx", fused_dq=True, cta_pair=True)]


def blackwell_backward_targets() -> list:
    """The TLX Blackwell dK/dV kernel (sm_100a): every shipped config (bf16, fp16 x D 64, 128) with the fused dQ
    ("[fused-dq]") and without it (the deterministic backward's) x causal, broadcast Q with the fused dQ,
    and grouped key/value heads (group 4)."""
    targets = []
    for dtype in ("bf16", "fp16"):
        for head_dim in (64, 128):
            for fused_dq in (True, False):
                suffix = "[fused-dq]" if fused_dq else ""
                for causal in (False, True):
                    targets.append(Target(f"blackwell-dkdv-{dtype}-D{head_dim}{'-causal' if causal else ''}{suffix}",
                                          "dkdv", dtype, head_dim, causal, False, arch=100, backend="tlx",
                                          fused_dq=fused_dq))
            targets.append(Target(f"blackwell-dkdv-{dtype}-D{head_dim}-bcastq[fused-dq]", "dkdv", dtype, head_dim,
                                  False, True, arch=100, backend="tlx", fused_dq=True))
    targets.append(Target("blackwell-dkdv-bf16-D128-causal-gqa4[fused-dq]", "dkdv", "bf16", 128, True, False,
                          arch=100, backend="tlx", fused_dq=True, group=4))
    return targets


def blackwell_mx_targets() -> list:
    """The TLX Blackwell MXFP8 forward (sm_100a): its D 128 builds (the head dim whose E8M0 scale tiles Triton's
    tcgen05.cp can copy, ``forward.mx_scale_tiles``) x FLOOR / RCEIL x plain, causal, causal broadcast-Q (bf16 out),
    and one causal grouped-heads build with fp32 out. The output dtype is ``dtype``; the inputs are E4M3."""
    targets = []
    for rule in ("floor", "rceil"):
        for causal, broadcast_q in ((False, False), (True, False), (True, True)):
            flags = ("-causal" if causal else "") + ("-bcastq" if broadcast_q else "")
            targets.append(Target(f"blackwell-mx-{rule}-bf16-D128{flags}", "forward", "bf16", 128, causal, broadcast_q,
                                  arch=100, backend="tlx", mx=rule))
    targets.append(Target("blackwell-mx-floor-fp32-D128-causal-gqa4", "forward", "fp32", 128, True, False, arch=100,
                          backend="tlx", group=4, mx="floor"))
    return targets + blackwell_mx_backward_targets()


def blackwell_mx_backward_targets() -> list:
    """The TLX Blackwell MXFP8 dK/dV builds (``backward.mx_dkdv_blackwell``, sm_100a) at D 128 (the head dim whose
    scale tiles tcgen05.cp can copy, ``backward.mx_scale_tiles``): FLOOR plain and causal, RCEIL causal broadcast-Q
    (bf16 gradients), FLOOR causal grouped heads (fp32 partials) and fp16 gradients."""
    def mx(name, dtype="bf16", causal=False, broadcast_q=False, rule="floor", **kw):
        return Target(f"blackwell-dkdv-mx{rule}-{dtype}-D128{name}", "dkdv", dtype, 128, causal, broadcast_q, arch=100,
                      backend="tlx", mx=rule, **kw)
    return [mx(""), mx("-causal", causal=True), mx("-causal-bcastq", causal=True, broadcast_q=True, rule="rceil"),
            mx("-causal-gqa4", causal=True, group=4), mx("-causal", dtype="fp16", causal=True)]


def all_targets() -> list:
    return shipped_targets() + tlx_targets() + blackwell_targets()


def _signature(fn, dtype: str) -> tuple[dict, dict]:
    sig, attrs = {}, {}
    for index, (name, param) in enumerate(inspect.signature(fn.fn).parameters.items()):
        if "constexpr" in str(param.annotation):
            sig[name] = "constexpr"
        elif name in ("LSE", "DELTA"):
            sig[name] = "*fp32"
        elif name in ("CU_Q", "CU_K", "TILES"):
            sig[name] = "*i32"
        elif name.isupper():
            sig[name] = f"*{dtype}"
        elif name == "sm_scale":
            sig[name] = "fp32"
        else:
            sig[name] = "i32"
        if sig[name].startswith("*") or name.startswith("stride"):
            attrs[(index,)] = [["tt.divisibility", 16]]
    return sig, attrs


def _resource_usage(cubin: bytes) -> dict:
    import triton

    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(cubin)
    try:
        text = subprocess.run([tool, "--dump-resource-usage", f.name], capture_output=True, text=True,
                              check=True).stdout
    finally:
        os.unlink(f.name)
    usage = {}
    for key in ("REG", "STACK", "LOCAL"):
        m = re.search(rf"\b{key}:(\d+)", text)
        usage[key] = int(m.group(1)) if m else -1
    return usage


def _compile(target: Target, fn, signature: dict, constants: dict, attrs: dict, options: dict,
             spill_allowance: int = 0):
    """Compile one target and apply the checks every kernel must pass; returns (compiled, result).
    ``spill_allowance``: stack bytes tolerated (``SM100_ENTRY_SPILL_BYTES`` for sm_100 TLX builds, else 0)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    start = time.time()
    compiled = triton.compile(ASTSource(fn, signature, constants, attrs), target=GPUTarget("cuda", target.arch, 32),
                              options=options)
    usage = _resource_usage(compiled.asm["cubin"])
    instruction = TENSOR_CORE_OPS[target.arch]
    mma = compiled.asm["ptx"].count(instruction)
    result = Result(target, True, [], usage["REG"], usage["STACK"], usage["LOCAL"], compiled.metadata.shared, mma,
                    round(time.time() - start, 2))
    if mma == 0:
        result.problems.append(f"no {instruction} in the PTX: the dots fell back to a slower path")
    if usage["LOCAL"] != 0 or usage["STACK"] > spill_allowance:
        result.problems.append(f"spills: {usage['LOCAL']} B local memory, {usage['STACK']} B stack")
    limit = SHARED_LIMITS[target.arch]
    if compiled.metadata.shared > limit:
        result.problems.append(f"shared memory {compiled.metadata.shared} B > sm_{target.arch} limit {limit} B")
    return compiled, result


def check(target: Target) -> Result:
    if target.backend == "tlx" and target.arch >= 100:
        return _check_blackwell(target)
    if target.backend == "tlx":
        return _check_tlx(target)
    import torch

    from jfa.kernels.triton import backward, forward
    from jfa.kernels.triton.configs import configs_for, padded_head_dim

    fn = {"forward": forward.jagged_fwd_kernel, "dkdv": backward.jagged_dkdv_kernel,
          "dq": backward.jagged_dq_kernel}[target.kernel]
    cfgs = configs_for(target.head_dim, {"bf16": torch.bfloat16, "fp16": torch.float16}[target.dtype])
    cfg = {"forward": cfgs.forward, "dkdv": cfgs.dkdv, "dq": cfgs.dq}[target.kernel]
    constants = dict(CAUSAL=target.causal, BROADCAST_Q=target.broadcast_q, DOT_PRECISION="tf32",
                     BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_D=padded_head_dim(target.head_dim),
                     HEAD_DIM=target.head_dim)
    sig, attrs = _signature(fn, target.dtype)
    _, result = _compile(target, fn, sig, constants, attrs,
                         dict(num_warps=cfg.num_warps, num_stages=cfg.num_stages))
    result.ok = not result.problems
    return result


# ptxas "Potential Performance Loss: wgmma.mma_async instructions are serialized" notes: C7513, C7514
# ("non wgmma instructions reading accumulator registers of a wgmma between start and end of the
# pipeline stage") and C7515 (both seen in experiments that kept a dQ MMA in flight across steps)
WGMMA_SERIALISED = {"C7513", "C7514", "C7515"}


def _ptxas_log(ptx: str, arch: int) -> str:
    """ptxas's verbose log for ``ptx`` with the flags Triton uses (Triton discards it): spill counts and
    performance warnings such as C7513 (wgmma serialised)."""
    import triton

    # Triton ships the Blackwell assembler beside the Hopper one (the latter rejects sm_100's PTX version)
    name = "ptxas-blackwell" if arch >= 100 else "ptxas"
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", name)
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "k.ptx")
        with open(src, "w") as f:
            f.write(ptx)
        proc = subprocess.run([tool, "-lineinfo", "-v", "--regAllocOptLevel=2", f"--gpu-name=sm_{arch}a", src,
                               "-o", os.path.join(tmp, "k.cubin")], capture_output=True, text=True)
    return proc.stdout + proc.stderr


def tlx_structure(ptx: str, ttgir: str, ptxas_log: str) -> dict:
    """What the TLX kernel turned into, read off its PTX, TTGIR and ptxas log."""
    requested = re.search(r"requestedRegisters = array<i32: ([0-9, ]+)>", ttgir)
    spills = [int(n) for n in re.findall(r"(\d+) bytes spill stores", ptxas_log)]
    setmaxnreg = re.findall(r"setmaxnreg\.(inc|dec)\.sync\.aligned\.u32\s+(\d+)", ptx)
    return {
        "warp_specialize": ttgir.count("ttg.warp_specialize("),
        "partitions": len(re.findall(r"^\s*partition\d+\(", ttgir, re.M)),
        "requested_registers": [int(x) for x in requested.group(1).split(",")] if requested else [],
        "setmaxnreg": {kind: sorted({int(n) for k, n in setmaxnreg if k == kind}) for kind in ("dec", "inc")},
        "tma_loads": ptx.count("cp.async.bulk.tensor"),
        "tma_reduce_adds": ptx.count("cp.reduce.async.bulk.tensor"),
        "global_atomics": len(re.findall(r"\batom\.global\.", ptx)),
        "expect_tx": ptx.count("mbarrier.arrive.expect_tx"),
        "mbarrier_waits": ptx.count("mbarrier.try_wait"),
        "mbarrier_arrives": len(re.findall(r"mbarrier\.arrive\.shared", ptx)),
        "named_barriers": sorted({int(n) for n in re.findall(r"\bbar\.(?:sync|arrive)\s+(\d+),\s*256;", ptx)}),
        "wgmma_waits": ptx.count("wgmma.wait_group"),
        # commits not followed by a wait-all before the next commit: MMAs in flight together
        "wgmma_overlaps": len(re.findall(r"wgmma\.commit_group(?=(?:(?!wgmma\.wait_group\.sync\.aligned 0;)[\s\S])*?"
                                         r"wgmma\.commit_group)", ptx)),
        "ptxas_spill_bytes": sum(spills) if spills else -1,
        "ptxas_warnings": sorted(set(re.findall(r"ptxas (?:warning|info)\s*: \((C\d+)\)[^\n]*", ptxas_log))),
    }


class _OfflineDriver:
    """Stands in for the CUDA driver while a launch is bound (never run) on a machine with no GPU."""

    def get_current_target(self):
        from triton.backends.compiler import GPUTarget

        return GPUTarget("cuda", 90, 32)

    def get_current_device(self):
        return 0

    def get_current_stream(self, device=None):
        return 0


@contextlib.contextmanager
def _offline_launches():
    """Launches inside the block bind their arguments through Triton's JIT on a machine with no GPU (an
    offline driver) and stop where Triton would compile. Yields a dict filled as they run: kernel name
    -> what that kernel's last launch would compile (``_binding``)."""
    from triton import knobs
    from triton.runtime.driver import driver

    seen = {}

    def hook(**kw):
        seen[kw["fn"].name] = _binding(kw["fn"].jit_function, kw["compile"])
        return True  # stop before compiling

    saved_hook = knobs.runtime.jit_cache_hook
    saved_driver = driver._active  # None until something asks for the (CUDA) driver; no public getter
    driver.set_active(_OfflineDriver())
    knobs.runtime.jit_cache_hook = hook
    try:
        yield seen
    finally:
        knobs.runtime.jit_cache_hook = saved_hook
        driver.set_active(saved_driver)


def _binding(kernel, compile_kwargs: dict) -> dict:
    """The specialisation of one bound launch: signature, constants (by name), the non-empty attributes,
    and the cache key as text (it carries the build settings of ``jfa.kernels.tlx.pipeline``)."""
    names = kernel.arg_names
    return {"signature": compile_kwargs["signature"],
            "constants": {names[path[0]]: value for path, value in compile_kwargs["constants"].items()},
            "attrs": {path: attr for path, attr in compile_kwargs["configs"][0].items() if attr},
            "key": str(compile_kwargs["key"])}


def _zero_mx(t, axis: str, rule: str, cu=None):
    """A ``jfa.mx.MXTensor`` of ``t``'s shape and dtype, all zero bytes, blocked along ``axis`` ("dim", or
    "tokens" by the offsets ``cu``): what an MXFP8 launch binds, for the offline launch bindings."""
    import torch

    from jfa import mx as jmx

    rows, heads, dim = t.shape
    data = torch.zeros(rows, heads, dim, dtype=torch.float8_e4m3fn)
    if axis == "dim":
        return jmx.MXTensor(data, torch.zeros(rows, heads, dim // 32, dtype=torch.uint8), axis, rule, t.dtype)
    scales = torch.zeros(jmx.token_scale_rows(rows, cu.numel() - 1), heads, dim, dtype=torch.uint8)
    return jmx.MXTensor(data, scales, axis, rule, t.dtype, cu_seqlens=cu, block_offsets=jmx.token_block_offsets(cu))


def _launch_inputs(target: Target):
    """CPU tensors shaped as a launch sees them: q, k, v slices of a fused [T, 3, H, D] projection (or a
    dense broadcast Q), offsets with an empty sequence. Returns (q, k, v, out_cu, cu_k, len_q)."""
    import torch

    from jfa.kernels.schedule import virtual_cu_seqlens

    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[target.dtype]
    heads, lengths = max(4, target.group), [300, 0, 700]
    if target.group > 1:  # packed [T, H + 2 H_kv, D] projection
        kv_heads = heads // target.group
        fused = torch.zeros(sum(lengths), heads + 2 * kv_heads, target.head_dim, dtype=dtype)
        q, k, v = fused[:, :heads], fused[:, heads:heads + kv_heads], fused[:, heads + kv_heads:]
    else:
        fused = torch.zeros(sum(lengths), 3, heads, target.head_dim, dtype=dtype)
        q, k, v = fused[:, 0], fused[:, 1], fused[:, 2]
    cu_k = torch.tensor([0, 300, 300, 1000], dtype=torch.int32)
    if not target.broadcast_q:
        return q, k, v, cu_k, cu_k, 0
    len_q = 256
    q = torch.zeros(len_q, heads, target.head_dim, dtype=dtype)
    return q, k, v, virtual_cu_seqlens(len(lengths), len_q, "cpu"), cu_k, len_q


def _every_block(out_cu, cu_k, heads: int, causal: bool):
    """Block lists naming every key block each query block sees (blocks of the sparse build's 128 rows),
    made on the host: what a sparse launch of the target takes."""
    import torch

    from jfa.kernels.block_lists import from_csr
    from jfa.kernels.schedule import num_tile_slots

    block = 128
    lq = (out_cu[1:] - out_cu[:-1]).tolist()
    lk = (cu_k[1:] - cu_k[:-1]).tolist()
    offsets, indices = [0], []
    for _head in range(heads):
        for a, b in zip(lq, lk):
            for t in range(-(-a // block)):
                n = -(-b // block)
                if causal:
                    last = min((t + 1) * block, a) - 1 + b - a
                    n = min(n, last // block + 1) if last >= 0 else 0
                indices += range(n)
                offsets.append(len(indices))
    nqb = (len(offsets) - 1) // heads
    return from_csr(torch.tensor(offsets), torch.tensor(indices), block_size=block, num_heads=heads,
                    num_q_blocks=nqb, num_q_slots=num_tile_slots(int(out_cu[-1]), len(lq), block), causal=causal)


def tlx_launch_binding(target: Target) -> dict:
    """Bind the arguments the TLX forward's launcher builds (``kernel_arguments``) to the kernel on CPU
    tensors, stopping before the compile, and return the specialisation a real launch would compile
    (``_binding``). The gate checks it equals what it compiled, so a launch on the GPU runs the very
    binary measured here."""
    import torch

    from jfa import knobs
    from jfa.kernels.schedule import build_tile_list
    from jfa.kernels.tlx.hopper import forward as tlx_forward

    q, k, v, out_cu, cu_k, len_q = _launch_inputs(target)
    num_seqs = cu_k.numel() - 1
    rows = num_seqs * len_q if target.broadcast_q else q.shape[0]
    out = torch.empty(rows, q.shape[1], q.shape[2], dtype=q.dtype)
    lse = torch.empty(rows, q.shape[1])
    cfg = tlx_forward.config_for(target.head_dim, target.mx)
    mx = None
    if target.mx:  # E4M3 bytes in the inputs' layout, scales as jfa.mx lays them out
        from jfa import mx as jmx

        q, k, v = (torch.zeros(t.shape, dtype=torch.uint8) for t in (q, k, v))  # contiguous, as jfa.mx makes them
        blocks = target.head_dim // jmx.BLOCK
        mx = (target.mx, torch.zeros(q.shape[0], q.shape[1], blocks, dtype=torch.uint8),
              torch.zeros(k.shape[0], k.shape[1], blocks, dtype=torch.uint8),
              torch.zeros(jmx.token_scale_rows(k.shape[0], num_seqs), k.shape[1], target.head_dim, dtype=torch.uint8),
              jmx.token_block_offsets(cu_k))
    lists = _every_block(out_cu, cu_k, q.shape[1], target.causal) if target.sparse else None
    if lists is not None:
        tiles = tlx_forward.sparse_tiles(lists, out_cu, rows)
    else:
        tiles = build_tile_list(out_cu, rows, tlx_forward.NUM_CONSUMERS * cfg.block_m, work_offsets=cu_k)
    counter = torch.zeros(2, dtype=torch.int32)
    timeline = torch.zeros(1, 4, dtype=torch.int64)
    args, kwargs, _ = tlx_forward.kernel_arguments(q, k, v, out, lse, out_cu, cu_k, tiles, counter, timeline,
                                                   causal=target.causal, softmax_scale=target.head_dim ** -0.5,
                                                   broadcast_q=target.broadcast_q, num_seqs=num_seqs,
                                                   len_q_bcast=len_q, window=target.window_size(),
                                                   variant=_variant(target), profile=target.profile, lists=lists,
                                                   mx=mx)
    with knobs.scope(tlx_own_waits=None, tlx_llvm_o0=None), tlx_forward.compiled_as_configured(cfg), \
            _offline_launches() as seen:
        tlx_forward.jagged_fwd_tlx_kernel.run(*args, grid=(1,), warmup=True, **kwargs)
    return seen[tlx_forward.jagged_fwd_tlx_kernel.fn.__name__]


@contextlib.contextmanager
def _offline_target(capability: tuple = (9, 0), grids: dict = None):
    """CPU tensors launch through Triton's JIT as if on a GPU of ``capability`` (132 SMs) inside the block: the
    launchers' own target lookup answers, and ``_offline_launches`` stops each launch before compiling.
    ``grids``: filled with kernel name -> (grid, positional args, keyword args) of its last launch."""
    from jfa.kernels.tlx.common.target import TOOLCHAIN_LOWERS_CLC, LaunchTarget, register_target

    def bind(kernel, grid, args, kwargs):
        if grids is not None:
            grids[kernel.fn.__name__] = (tuple(grid), args, kwargs)
        kernel[grid](*args, **kwargs)

    # CLC as the GPU's own target decides it
    previous = register_target("cpu", LaunchTarget("offline-binding", capability, OFFLINE_SM_COUNT, bind,
                                                   TOOLCHAIN_LOWERS_CLC and capability[0] >= 10))
    try:
        yield
    finally:
        register_target("cpu", previous)


def dkdv_launch_binding(target: Target) -> dict:
    """What a launch of the dK/dV kernel by its launcher (``jagged_dkdv_tlx``, the fused dQ with its
    accumulator for a "fused-dq" target) would compile, bound on CPU tensors like
    ``tlx_launch_binding``; the statistics' pass before it stops at its compile too. The launch target
    (capability and SM count) is answered for it (``_offline_target``)."""
    import torch

    from jfa import knobs
    from jfa.kernels.tlx.hopper import backward as tlx_backward

    q, k, v, out_cu, cu_k, len_q = _launch_inputs(target)
    num_seqs = cu_k.numel() - 1
    rows = num_seqs * len_q if target.broadcast_q else q.shape[0]
    out, dout = (torch.zeros(rows, q.shape[1], q.shape[2], dtype=q.dtype) for _ in range(2))
    lse = torch.zeros(rows, q.shape[1])
    fused = target.fused_dq
    dq_accum = tlx_backward.DqAccumulator(q, zeroed=False) if fused else None
    with _offline_target(), knobs.scope(tlx_own_waits=None, tlx_llvm_o0=None), _offline_launches() as seen:
        tlx_backward.jagged_dkdv_tlx(q, k, v, dout, lse, None if fused else torch.zeros_like(lse),
                                     torch.empty_like(k), torch.empty_like(v), out_cu, cu_k, causal=target.causal,
                                     softmax_scale=target.head_dim ** -0.5, broadcast_q=target.broadcast_q,
                                     num_seqs=num_seqs, len_q_bcast=len_q, dq_accum=dq_accum,
                                     outputs=(out, dout, None) if fused else None, window=target.window_size(),
                                     lists=_every_block(out_cu, cu_k, q.shape[1], target.causal) if target.sparse
                                     else None, profile=target.profile, variant=_backward_variant(target))
    return seen[tlx_backward.jagged_dkdv_tlx_kernel.fn.__name__]


def _mx_dkdv_binding(target: Target, launcher, kernel, capability: tuple = (9, 0)) -> dict:
    """What ``launcher`` (an MXFP8 dK/dV launcher: ``mx_dkdv_tlx`` or ``mx_dkdv_blackwell``) would compile for
    ``kernel``, bound on CPU MXTensors shaped like ``_launch_inputs``' tensors (as
    ``jfa.kernels.triton.mx_attention.mx_backward`` quantizes them), the launch target answering ``capability``;
    the statistics' pass before it stops at its compile too."""
    import torch

    from jfa import knobs

    q, k, v, out_cu, cu_k, len_q = _launch_inputs(target)
    num_seqs = cu_k.numel() - 1
    rows = num_seqs * len_q if target.broadcast_q else q.shape[0]
    dout = torch.zeros(rows, q.shape[1], q.shape[2], dtype=q.dtype)
    q_cu = torch.tensor([0, q.shape[0]], dtype=torch.int32) if target.broadcast_q else out_cu

    def as_mx(t, axis, cu=None):
        return _zero_mx(t, axis, target.mx, cu)

    lse = torch.zeros(rows, q.shape[1])
    with _offline_target(capability), knobs.scope(tlx_own_waits=None, tlx_llvm_o0=None), _offline_launches() as seen:
        launcher(as_mx(q, "dim"), as_mx(q, "tokens", q_cu), as_mx(k, "dim"), as_mx(v, "dim"), as_mx(dout, "dim"),
                 as_mx(dout, "tokens", out_cu), lse, torch.zeros_like(lse), torch.empty(k.shape, dtype=k.dtype),
                 torch.empty(v.shape, dtype=v.dtype), out_cu, cu_k, causal=target.causal,
                 softmax_scale=target.head_dim ** -0.5, broadcast_q=target.broadcast_q, num_seqs=num_seqs,
                 len_q_bcast=len_q, rule=target.mx)
    return seen[kernel.fn.__name__]


def mx_dkdv_launch_binding(target: Target) -> dict:
    """What a launch of the Hopper MXFP8 dK/dV build by its launcher (``mx_dkdv_tlx``) would compile."""
    from jfa.kernels.tlx.hopper import backward as tlx_backward

    return _mx_dkdv_binding(target, tlx_backward.mx_dkdv_tlx, tlx_backward.jagged_dkdv_tlx_kernel)


def _variant(target: Target):
    from jfa.kernels.tlx.hopper.forward import Variant

    return Variant.parse(target.switches)


def _backward_variant(target: Target):
    from jfa.kernels.tlx.hopper.backward import SHIPPED, BackwardVariant

    # without switches: what ships, its K/V slot pairs those of a launch whose items are not known to be short
    # (one pair; the two that short items take are the targets with item_prefetch=always)
    return BackwardVariant.parse(target.switches) if target.switches else replace(SHIPPED, item_prefetch="never")


def _compile_tlx(target: Target, spec, num_consumers: int, llvm_o0: bool = False, consumer_regs: int = None,
                 spill_allowance: int = 0):
    """Compile a TLX kernel and judge what every one must show: one warp-specialised region with the
    consumer partitions, setmaxnreg both ways, TMA loads, mbarrier waits, no ptxas spill, no wgmma
    serialisation. ``llvm_o0``: the build's config leaves its LLVM IR to ptxas, as its launcher does
    (``pipeline.build_llvm_o0``). Returns (compiled, result, expected) with the checks still to be
    applied."""
    from jfa import knobs
    from jfa.kernels.tlx import pipeline

    fn, sig, constants, attrs, options = spec
    pipeline.install()
    # both compile switches at their defaults, whatever the environment says: the gate judges each build
    # as it ships
    with knobs.scope(tlx_own_waits=None, tlx_llvm_o0=None), pipeline.build_llvm_o0(fn.fn.__name__, llvm_o0):
        compiled, result = _compile(target, fn, sig, constants, attrs, options, spill_allowance)
        own_waits = pipeline.enabled(fn.fn.__name__)
    structure = tlx_structure(compiled.asm["ptx"], compiled.asm["ttgir"],
                              _ptxas_log(compiled.asm["ptx"], target.arch))
    result.details = structure
    consumer_regs = constants["CONSUMER_REGS"] if consumer_regs is None else consumer_regs
    expected = {
        "one warp_specialize region": structure["warp_specialize"] == 1,
        f"{num_consumers} consumer partitions": structure["partitions"] == num_consumers,
        f"setmaxnreg.inc {consumer_regs} (consumers)": consumer_regs in structure["setmaxnreg"]["inc"],
        "setmaxnreg.dec (producer)": bool(structure["setmaxnreg"]["dec"]),
        "TMA loads (cp.async.bulk.tensor)": structure["tma_loads"] > 0,
        "mbarrier waits": structure["mbarrier_waits"] > 0,
        (f"ptxas reports at most {spill_allowance} spill bytes (the entry's thread indices)" if spill_allowance
         else "ptxas reports 0 spill bytes"): 0 <= structure["ptxas_spill_bytes"] <= spill_allowance,
        "no ptxas wgmma serialisation (C7513-C7515)": not set(structure["ptxas_warnings"]) & WGMMA_SERIALISED,
    }
    # what ships for the dK/dV kernel is its own waits (knobs.tlx_own_waits' default): required here
    # whatever the default says, so that the gate fails if the shipped build loses them
    if (own_waits or target.kernel == "dkdv") and target.arch < 100:  # (wgmma: Hopper's)
        expected["MMAs in flight together (the source's waits, not a wait-all per commit)"] = \
            structure["wgmma_overlaps"] > 0
    return compiled, result, expected


def _finish(result: Result, expected: dict) -> Result:
    result.problems += [f"missing: {what}" for what, ok in expected.items() if not ok]
    result.ok = not result.problems
    return result


def _binds_as_compiled(launch: dict, spec, result: Result) -> dict:
    """The gate's checks that a bound launch (``_binding``) specialises to the compiled ``spec``; also
    recorded in ``result.details["launch_binds_as_compiled"]``."""
    _, sig, constants, attrs, _ = spec
    result.details["launch_binds_as_compiled"] = launch["signature"] == sig and launch["attrs"] == attrs
    return {"a launch binds to the compiled signature": launch["signature"] == sig,
            "a launch binds to the compiled constants": launch["constants"] == constants,
            "a launch binds to the compiled attributes": launch["attrs"] == attrs}


def _check_tlx(target: Target) -> Result:
    if target.kernel == "dkdv":
        from jfa.kernels.tlx.hopper import backward as tlx_backward

        fused = target.fused_dq
        variant = _backward_variant(target)
        spec = tlx_backward.compile_spec(target.dtype, target.head_dim, causal=target.causal,
                                         broadcast_q=target.broadcast_q, fused_dq=fused, window=target.window,
                                         group=target.group, sparse=target.sparse, mx=target.mx,
                                         profile=target.profile, variant=variant)
        cfg = tlx_backward.config_for(target.head_dim, fused, target.mx)
        compiled, result, expected = _compile_tlx(target, spec, tlx_backward.NUM_CONSUMERS, llvm_o0=cfg.llvm_o0)
        expected["global-timer reads exactly in the profiling build"] = \
            ("%globaltimer" in compiled.asm["ptx"]) == target.profile
        if target.mx:  # the MX producer loads E4M3 bytes with 16-byte loads (the statistics still by TMA)
            _vector_loads(compiled, result, expected)
        expected["TMA reduce-adds of dQ exactly in the fused build"] = (result.details["tma_reduce_adds"] > 0) == fused
        dynamic = variant.dynamic(target.sparse, causal=target.causal, window=target.window, mx=bool(target.mx))
        expected["the work counter's atomics exactly in the dynamic schedule's build"] = \
            (result.details["global_atomics"] > 0) == dynamic
        launch = mx_dkdv_launch_binding(target) if target.mx else dkdv_launch_binding(target)
        expected.update(_binds_as_compiled(launch, spec, result))
        expected.update(_compiles_with_llvm_setting(launch, tlx_backward.jagged_dkdv_tlx_kernel, cfg.llvm_o0))
        return _finish(result, expected)
    from jfa.kernels.tlx.hopper import forward as tlx_forward

    variant = _variant(target)
    spec = tlx_forward.compile_spec(target.dtype, target.head_dim, causal=target.causal,
                                    broadcast_q=target.broadcast_q, window=target.window, group=target.group,
                                    variant=variant, profile=target.profile, sparse=target.sparse, mx=target.mx)
    cfg = tlx_forward.config_for(target.head_dim, target.mx)
    compiled, result, expected = _compile_tlx(target, spec, tlx_forward.NUM_CONSUMERS, llvm_o0=cfg.llvm_o0)
    if target.mx:  # the MX producer reads E4M3 bytes with coalesced 16-byte loads, not TMA
        del expected["TMA loads (cp.async.bulk.tensor)"]
        _vector_loads(compiled, result, expected)
    expected["pingpong named barriers 9 and 10 (none without pingpong)"] = \
        result.details["named_barriers"] == ([9, 10] if variant.pingpong else [])
    launch = tlx_launch_binding(target)
    expected.update(_binds_as_compiled(launch, spec, result))
    expected.update(_compiles_with_llvm_setting(launch, tlx_forward.jagged_fwd_tlx_kernel, cfg.llvm_o0))
    return _finish(result, expected)


def _compiles_with_llvm_setting(launch: dict, kernel, llvm_o0: bool) -> dict:
    """The check that a launch's cache key carries the LLVM setting the gate compiled ``kernel`` with: the
    ``jfa-llvm-o0-<kernel name>`` marker present, naming ``kernel`` exactly when its config asks for O0."""
    o0 = re.search(r"jfa-llvm-o0-([\w+]*)", launch["key"])
    return {"a launch compiles with the gate's LLVM setting (cache key)":
            o0 is not None and (o0.group(1) == kernel.fn.__name__) == llvm_o0}


def _vector_loads(compiled, result: Result, expected: dict) -> None:
    """The MX producers' checks: 16-byte loads of the E4M3 bytes and 16-byte stores of the dequantized tiles."""
    vector_loads = len(re.findall(r"ld\.global(?:\.nc)?(?:\.L1::\w+)?\.v4", compiled.asm["ptx"]))
    result.details["vector_loads"] = vector_loads
    expected["16-byte loads of the E4M3 bytes (ld.global.v4)"] = vector_loads > 0
    expected["16-byte stores of the dequantized tiles (st.shared.v4)"] = \
        re.search(r"st\.shared(?:::cta)?\.v4", compiled.asm["ptx"]) is not None


def blackwell_launch_binding(target: Target) -> dict:
    """What a launch of the Blackwell forward by its launcher (``jagged_forward_blackwell``) would compile, bound
    on CPU tensors like ``tlx_launch_binding`` (the launch target answering sm_100)."""
    from jfa import knobs
    from jfa.kernels.tlx.blackwell import forward as bw

    q, k, v, out_cu, cu_k, len_q = _launch_inputs(target)
    grids = {}
    with _offline_target((10, 0), grids), knobs.scope(tlx_own_waits=None, tlx_llvm_o0=None), \
            _offline_launches() as seen:
        bw.jagged_forward_blackwell(q, k, v, None if target.broadcast_q else out_cu, cu_k, causal=target.causal,
                                    softmax_scale=target.head_dim ** -0.5, broadcast_q=target.broadcast_q,
                                    num_seqs=cu_k.numel() - 1, len_q_bcast=len_q)
    name = bw.jagged_fwd_blackwell_kernel.fn.__name__
    return {**seen[name], "grid_fits_schedule": _grid_fits_schedule(bw.jagged_fwd_blackwell_kernel, *grids[name])}


def _grid_fits_schedule(kernel, grid: tuple, args: tuple, kwargs: dict) -> bool:
    """Whether a persistent forward's launch grid fits its schedule (the ``CLC`` constexpr): one CTA per work item
    (``num_slots * num_heads``) for CLC (it hands out the items of CTAs that have not started, so a smaller grid
    leaves items nobody works), at most one per SM for the static one."""
    names = kernel.arg_names
    items = args[names.index("num_slots")] * args[names.index("num_heads")]
    return args[names.index("num_items")] == items and \
        grid == ((items,) if kwargs["CLC"] else (min(OFFLINE_SM_COUNT, items),))


def _tensor_memory(compiled, result: Result, expected: dict, *, commits: str, loads: str) -> None:
    """An sm_100 build's tensor memory: its columns (within the SM's), tcgen05.commit and tcgen05.ld present
    (``commits``, ``loads``: what each is for in this kernel), into ``result.details`` and ``expected``."""
    ptx = compiled.asm["ptx"]
    tmem = getattr(compiled.metadata, "tmem_size", -1)
    result.details.update(tmem_columns=tmem, tcgen05_commits=len(re.findall(r"tcgen05\.commit", ptx)),
                          tcgen05_loads=len(re.findall(r"tcgen05\.ld\b", ptx)))
    expected.update({
        f"tensor memory within {SM100_TMEM_COLUMNS} columns": 0 < tmem <= SM100_TMEM_COLUMNS,
        f"tcgen05.commit ({commits})": result.details["tcgen05_commits"] > 0,
        f"tcgen05.ld ({loads})": result.details["tcgen05_loads"] > 0,
    })


def blackwell_dkdv_launch_binding(target: Target) -> dict:
    """What a launch of the Blackwell dK/dV kernel by its launcher (``jagged_dkdv_blackwell``, with the fused dQ's
    accumulator for a "fused-dq" target) would compile, bound on CPU tensors like ``dkdv_launch_binding``."""
    import torch

    from jfa import knobs
    from jfa.kernels.tlx.blackwell import backward as bwb

    q, k, v, out_cu, cu_k, len_q = _launch_inputs(target)
    num_seqs = cu_k.numel() - 1
    rows = num_seqs * len_q if target.broadcast_q else q.shape[0]
    out, dout = (torch.zeros(rows, q.shape[1], q.shape[2], dtype=q.dtype) for _ in range(2))
    lse = torch.zeros(rows, q.shape[1])
    fused = target.fused_dq
    with _offline_target((10, 0)), knobs.scope(tlx_own_waits=None, tlx_llvm_o0=None), _offline_launches() as seen:
        bwb.jagged_dkdv_blackwell(q, k, v, dout, lse, None, torch.empty_like(k), torch.empty_like(v), out_cu, cu_k,
                                  causal=target.causal, softmax_scale=target.head_dim ** -0.5,
                                  broadcast_q=target.broadcast_q, num_seqs=num_seqs, len_q_bcast=len_q,
                                  dq_accum=torch.zeros(q.shape) if fused else None, outputs=(out, dout, None))
    return seen[bwb.jagged_dkdv_blackwell_kernel.fn.__name__]


def _check_blackwell_dkdv(target: Target) -> Result:
    """The Blackwell dK/dV kernel for sm_100a: the forward's checks (tcgen05, TMEM, shared memory, partitions
    and their registers, spill, launch binding), and TMA reduce-adds of dQ exactly in the fused build."""
    from jfa.kernels.tlx.blackwell import backward as bwb

    fused = target.fused_dq
    spec = bwb.compile_spec(target.dtype, target.head_dim, causal=target.causal, broadcast_q=target.broadcast_q,
                            fused_dq=fused, group=target.group, cta_pair=target.cta_pair, mx=target.mx)
    cfg = bwb.config_for(target.head_dim, target.cta_pair, target.mx)
    compiled, result, expected = _compile_tlx(target, spec, 3, llvm_o0=cfg.llvm_o0, consumer_regs=cfg.compute_regs,
                                              spill_allowance=SM100_ENTRY_SPILL_BYTES)
    _tensor_memory(compiled, result, expected, commits="dK/dV, K/V handed on once the item's MMAs completed",
                   loads="S^T, dP^T, dK, dV, dQ read from tensor memory")
    expected.update({
        f"partition registers as stated ({cfg.compute_regs} compute, {bwb.ISSUER_REGS.value} issuers)":
            result.details["requested_registers"] == [cfg.compute_regs] + [bwb.ISSUER_REGS.value] * 2,
        "TMA reduce-adds of dQ exactly in the fused build": (result.details["tma_reduce_adds"] > 0) == fused,
    })
    result.details["two_cta_mmas"] = compiled.asm["ptx"].count("tcgen05.mma.cta_group::2")
    expected["2-CTA MMAs (tcgen05.mma.cta_group::2) exactly in the 2-CTA build"] = \
        (result.details["two_cta_mmas"] > 0) == target.cta_pair
    if target.mx:  # all four products on the block-scaled MMA, the scales copied into tensor memory before them
        _block_scaled(compiled, result, expected)
    if target.cta_pair:  # no launch runs it (TOOLCHAIN_LOWERS_TWO_CTA): nothing to bind
        return _finish(result, expected)
    launch = blackwell_mx_dkdv_launch_binding(target) if target.mx else blackwell_dkdv_launch_binding(target)
    expected.update(_binds_as_compiled(launch, spec, result))
    expected.update(_compiles_with_llvm_setting(launch, bwb.jagged_dkdv_blackwell_kernel, cfg.llvm_o0))
    return _finish(result, expected)


def blackwell_mx_launch_binding(target: Target) -> dict:
    """What a launch of the Blackwell MXFP8 forward by its launcher (``mx_forward_blackwell``) would compile, bound
    on CPU MXTensors shaped like ``_launch_inputs``' tensors (the launch target answering sm_100)."""
    from jfa import knobs
    from jfa.kernels.tlx.blackwell import forward as bw

    q, k, v, out_cu, cu_k, len_q = _launch_inputs(target)

    def as_mx(t, axis):
        return _zero_mx(t, axis, target.mx, cu_k)

    grids = {}
    with _offline_target((10, 0), grids), knobs.scope(tlx_own_waits=None, tlx_llvm_o0=None), \
            _offline_launches() as seen:
        bw.mx_forward_blackwell(as_mx(q, "dim"), as_mx(k, "dim"), as_mx(v, "tokens"),
                                None if target.broadcast_q else out_cu, cu_k, causal=target.causal,
                                softmax_scale=target.head_dim ** -0.5, broadcast_q=target.broadcast_q,
                                num_seqs=cu_k.numel() - 1, len_q_bcast=len_q, rule=target.mx, out_dtype=q.dtype)
    name = bw.jagged_fwd_blackwell_kernel.fn.__name__
    return {**seen[name], "grid_fits_schedule": _grid_fits_schedule(bw.jagged_fwd_blackwell_kernel, *grids[name])}


def _block_scaled(compiled, result: Result, expected: dict) -> None:
    """An MXFP8 sm_100 build's MMAs: every tcgen05 MMA block-scaled (kind::mxf8f6f4 .block_scale), its E8M0 scales
    copied into tensor memory (tcgen05.cp)."""
    ptx = compiled.asm["ptx"]
    result.details["block_scaled_mmas"] = len(re.findall(r"tcgen05\.mma\S*kind::mxf8f6f4\S*block_scale", ptx))
    expected["block-scaled tcgen05 MMAs (kind::mxf8f6f4 .block_scale)"] = result.details["block_scaled_mmas"] > 0
    expected["no unscaled tcgen05 MMA"] = result.details["block_scaled_mmas"] == result.tensor_core_ops
    expected["E8M0 scales copied into tensor memory (tcgen05.cp)"] = re.search(r"tcgen05\.cp\b", ptx) is not None


def blackwell_mx_dkdv_launch_binding(target: Target) -> dict:
    """What a launch of the Blackwell MXFP8 dK/dV build by its launcher (``mx_dkdv_blackwell``) would compile, the
    launch target answering sm_100."""
    from jfa.kernels.tlx.blackwell import backward as bwb

    return _mx_dkdv_binding(target, bwb.mx_dkdv_blackwell, bwb.jagged_dkdv_blackwell_kernel, (10, 0))


def _check_blackwell(target: Target) -> Result:
    """The Blackwell forward for sm_100a: tcgen05 MMAs and commits, TMEM within the SM's 512 columns, shared
    memory within 227 KB, the five partitions with the registers the config states, TMA loads, mbarrier
    waits, no spill, and a launch that binds to exactly this build (signature, constants, LLVM setting)."""
    if target.kernel == "dkdv":
        return _check_blackwell_dkdv(target)
    from jfa.kernels.tlx.blackwell import forward as bw
    from jfa.kernels.tlx.common.target import TOOLCHAIN_LOWERS_CLC

    clc = TOOLCHAIN_LOWERS_CLC if target.clc is None else target.clc
    spec = bw.compile_spec(target.dtype, target.head_dim, causal=target.causal, broadcast_q=target.broadcast_q,
                           group=target.group, mx=target.mx, clc=clc)
    cfg = bw.config_for(target.head_dim, target.mx)
    compiled, result, expected = _compile_tlx(target, spec, bw.NUM_GROUPS + 2, llvm_o0=cfg.llvm_o0,
                                              consumer_regs=cfg.softmax_regs, spill_allowance=SM100_ENTRY_SPILL_BYTES)
    _tensor_memory(compiled, result, expected, commits="Q handed back once its MMAs completed",
                   loads="S and O read from tensor memory")
    ptx = compiled.asm["ptx"]
    expected.update({
        f"partition registers as stated ({cfg.softmax_regs} softmax, {bw.ISSUER_REGS.value} issuers)":
            result.details["requested_registers"] == [cfg.softmax_regs] * bw.NUM_GROUPS + [bw.ISSUER_REGS.value] * 2,
    })
    if target.mx:  # both products on the block-scaled MMA, the scales copied into tensor memory before it
        _block_scaled(compiled, result, expected)
    # the persistent schedule: the CLC build takes each next work item from cluster launch control
    result.details["clc_try_cancels"] = len(re.findall(r"clusterlaunchcontrol\.try_cancel", ptx))
    result.details["clc_queries"] = len(re.findall(r"clusterlaunchcontrol\.query_cancel", ptx))
    expected[f"CLC requests (clusterlaunchcontrol.try_cancel) exactly in the CLC build ({clc})"] = \
        (result.details["clc_try_cancels"] > 0) == clc
    expected[f"CLC answers read (clusterlaunchcontrol.query_cancel) exactly in the CLC build ({clc})"] = \
        (result.details["clc_queries"] > 0) == clc
    if clc != TOOLCHAIN_LOWERS_CLC:  # a build no launch runs: nothing to bind
        return _finish(result, expected)
    launch = blackwell_mx_launch_binding(target) if target.mx else blackwell_launch_binding(target)
    expected["a launch's grid fits its schedule (CLC: one CTA per work item; static: one per SM)"] = \
        launch["grid_fits_schedule"]
    expected.update(_binds_as_compiled(launch, spec, result))
    expected.update(_compiles_with_llvm_setting(launch, bw.jagged_fwd_blackwell_kernel, cfg.llvm_o0))
    return _finish(result, expected)


def _targets(backend: str) -> list:
    return {"all": all_targets, "triton": shipped_targets, "tlx": tlx_targets,
            "mx": lambda: mx_targets() + mx_backward_targets(),
            "blackwell": blackwell_targets, "blackwell-mx": blackwell_mx_targets,
            "blackwell-clc": blackwell_clc_targets, "blackwell-2cta": blackwell_two_cta_targets}[backend]()


def run_out_of_process(backend: str, timeout: float = 1200, jobs: int | None = None, only: tuple = ()) -> dict:
    """Run the gate for ``backend`` ("triton" | "tlx" | "blackwell" | "all"; ``only``: just the targets of these
    names) in ``jobs`` child processes at once (one shard of the targets each; default: one per usable CPU,
    at most one per target), without the interpreter (callers such as the test suite have it switched on),
    all within ``timeout`` seconds; results by target name. Raises RuntimeError, with the children's
    stderr, when a child dies or a target has no result."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    names = [t.name for t in _targets(backend) if not only or t.name in only]
    select = ["--only", ",".join(names)] if only else []
    jobs = max(1, min(jobs or len(os.sched_getaffinity(0)), len(names)))
    children = [subprocess.Popen([sys.executable, "-m", "jfa.fuzz.compile_gate", "--json", "--backend", backend,
                                  "--shard", f"{i}/{jobs}", *select], env=env, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True) for i in range(jobs)]
    deadline = time.monotonic() + timeout
    rows, errors = [], []
    try:
        for i, child in enumerate(children):
            try:
                out, err = child.communicate(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                child.kill()
                out, err = child.communicate()
                err += f"\n(shard {i}/{jobs} killed at the {timeout:.0f} s deadline)"
            rows += [json.loads(line) for line in out.splitlines() if line.startswith("{")]
            if child.returncode not in (0, 1):  # 1: some target failed the gate (its row says why)
                errors.append(f"shard {i}/{jobs} exited {child.returncode}:\n{err[-3000:]}")
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
    results = {row["target"]["name"]: row for row in rows}
    missing = [n for n in names if n not in results]
    if missing or errors:
        raise RuntimeError(f"compile_gate: no result for {len(missing)} target(s) {missing[:5]}:\n"
                           + "\n".join(errors))
    return results


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="jfa compile-check", description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print results as JSON lines")
    parser.add_argument("--only", default="", help="comma-separated substrings of target names")
    parser.add_argument("--backend", default="all",
                        choices=("all", "triton", "tlx", "mx", "blackwell", "blackwell-mx", "blackwell-clc",
                                 "blackwell-2cta"),
                        help="only the portable Triton targets, only the TLX Hopper ones, the TLX MXFP8 builds' (forward and dK/dV), "
                             "the TLX Blackwell (sm_100a) kernels', the Blackwell MXFP8 build's (not in 'all'), or "
                             "the Blackwell forward's CLC build or the backward's 2-CTA build, whether the toolchain "
                             "builds them or not (not in 'all')")
    parser.add_argument("--shard", default="0/1", metavar="I/N",
                        help="only every N-th target, starting at the I-th (parallel runs)")
    args = parser.parse_args(argv)
    shard, _, shards = args.shard.partition("/")
    if not (shard.isdigit() and shards.isdigit() and int(shard) < int(shards)):
        parser.error(f"--shard: expected I/N with 0 <= I < N, got {args.shard!r}")
    if os.environ.get("TRITON_INTERPRET") == "1":
        print("jfa compile-check: unset TRITON_INTERPRET (the interpreter cannot compile kernels)", file=sys.stderr)
        return 2
    wanted = [s for s in args.only.split(",") if s]
    pool = [t for t in _targets(args.backend) if not wanted or any(w in t.name for w in wanted)]
    if not pool:
        print(f"jfa compile-check: no target matches --only {args.only!r} (backend {args.backend})", file=sys.stderr)
        return 2
    results = []
    for target in pool[int(shard)::int(shards)]:
        try:
            r = check(target)
        except Exception as exc:  # one target's crash is that target's failure, not the run's
            root = exc
            while root.__cause__ is not None:  # the compiler wraps the builtin's own error: name that too
                root = root.__cause__
            cause = f" (caused by {type(root).__name__}: {root})" if root is not exc else ""
            r = Result(target, False, [f"the gate raised {type(exc).__name__}: {exc}{cause}"])
        results.append(r)
        if args.json:
            print(json.dumps({**asdict(r), "target": asdict(r.target)}), flush=True)
        else:
            status = "ok" if r.ok else "FAIL: " + "; ".join(r.problems)
            extra = ""
            if r.details:
                d = r.details
                regs = d["setmaxnreg"]
                extra = (f"  setmaxnreg dec {','.join(map(str, regs['dec']))} inc {','.join(map(str, regs['inc']))}"
                         f"  tma {d['tma_loads']}  mbar-waits {d['mbarrier_waits']}"
                         f"  named-bars {','.join(map(str, d['named_barriers']))}")
                if "tmem_columns" in d:
                    extra += f"  tmem {d['tmem_columns']}  tcgen05 commits {d['tcgen05_commits']}"
            print(f"{r.target.name:34s} sm_{r.target.arch}a  regs {r.registers:3d}  local {r.local_bytes}  "
                  f"stack {r.stack_bytes}  smem {r.shared_bytes:6d}  mma {r.tensor_core_ops:3d}  {r.seconds:5.1f}s"
                  f"{extra}  {status}",
                  flush=True)
    return 0 if all(r.ok for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
