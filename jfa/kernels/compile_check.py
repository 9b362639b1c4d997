"""Offline compile gate: build the shipped kernels for Hopper (sm_90a) on a machine with no GPU and
check what the hardware will run: the tensor-core instruction is there (wgmma), nothing spills to
local memory, shared memory fits the SM.

Triton compiles to PTX and ptxas (shipped in the triton wheel) assembles the cubin; cuobjdump (also
shipped) reads registers, stack and local memory off the cubin. Needs a process in which triton is
NOT in interpreter mode (``TRITON_INTERPRET`` unset): run ``python -m jfa.kernels.compile_check``.
Each target is one kernel with one shipped config and one set of compile-time flags; the runtime
integer arguments are declared 16-divisible, as Triton specialises them at launch for aligned shapes.
"""
from __future__ import annotations

import argparse
import inspect
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass

SM90_SHARED_LIMIT = 227 * 1024  # bytes of shared memory one CTA may use on sm_90


@dataclass
class Target:
    name: str
    kernel: str  # "forward" | "dkdv" | "dq"
    dtype: str
    head_dim: int
    causal: bool
    broadcast_q: bool
    arch: int = 90


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


def check(target: Target) -> Result:
    import torch
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

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
    start = time.time()
    compiled = triton.compile(ASTSource(fn, sig, constants, attrs), target=GPUTarget("cuda", target.arch, 32),
                              options=dict(num_warps=cfg.num_warps, num_stages=cfg.num_stages))
    usage = _resource_usage(compiled.asm["cubin"])
    mma = compiled.asm["ptx"].count("wgmma.mma_async")
    result = Result(target, True, [], usage["REG"], usage["STACK"], usage["LOCAL"], compiled.metadata.shared, mma,
                    round(time.time() - start, 2))
    if mma == 0:
        result.problems.append("no wgmma in the PTX: the dots fell back to a slower path")
    if usage["LOCAL"] != 0 or usage["STACK"] != 0:
        result.problems.append(f"spills: {usage['LOCAL']} B local memory, {usage['STACK']} B stack")
    if compiled.metadata.shared > SM90_SHARED_LIMIT:
        result.problems.append(f"shared memory {compiled.metadata.shared} B > sm_90 limit {SM90_SHARED_LIMIT} B")
    result.ok = not result.problems
    return result


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="jfa compile-check", description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print results as JSON lines")
    parser.add_argument("--only", default="", help="comma-separated substrings of target names")
    args = parser.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET") == "1":
        print("jfa compile-check: unset TRITON_INTERPRET (the interpreter cannot compile kernels)", file=sys.stderr)
        return 2
    wanted = [s for s in args.only.split(",") if s]
    results = [check(t) for t in shipped_targets() if not wanted or any(w in t.name for w in wanted)]
    for r in results:
        if args.json:
            print(json.dumps({**asdict(r), "target": asdict(r.target)}))
        else:
            status = "ok" if r.ok else "FAIL: " + "; ".join(r.problems)
            print(f"{r.target.name:28s} sm_{r.target.arch}a  regs {r.registers:3d}  local {r.local_bytes}  "
                  f"smem {r.shared_bytes:6d}  wgmma {r.tensor_core_ops:3d}  {r.seconds:5.1f}s  {status}")
    return 0 if all(r.ok for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
