"""Host-side rules every TLX launcher shares: what TMA can read, which inputs a kernel takes, TMA
descriptors over packed tensors, ablation variants from their switches, and offline compile specs.

Nothing here touches a GPU at import; device properties are read through the launch target
(:mod:`jfa.kernels.tlx.common.target`) when a launcher asks.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Mapping, Optional, get_type_hints

import torch

from jfa.knobs import parse_bool
from jfa.kernels.tlx import pipeline
from jfa.kernels.tlx.common.target import target_for

try:  # the import itself touches no GPU (checked on a CPU-only machine); it fails on a Triton without uTLX
    import triton.language.extra.tlx as tlx

    pipeline.install()  # compile switches of the TLX builds (jfa.kernels.tlx.pipeline)
    from jfa.kernels.tlx.common import scaled_mma

    scaled_mma.install()  # tlx.async_dot_scaled as this plugin compiles it (jfa.kernels.tlx.common.scaled_mma)
    TLX_IMPORT_ERROR: Optional[ImportError] = None
except ImportError as exc:  # pragma: no cover - depends on the installed Triton
    tlx = None
    TLX_IMPORT_ERROR = exc

DTYPES = (torch.bfloat16, torch.float16)  # what the TLX kernels compute in (fp32 stays portable)


@dataclass(frozen=True)
class View2D:
    """A packed ``[T, H, D]`` tensor seen by TMA as the 2-D array ``[T, width]`` with row stride
    ``row_stride``; head h is the column block ``[h * col_stride, h * col_stride + D)``."""

    rows: int
    width: int
    row_stride: int
    col_stride: int


def view_2d(t: torch.Tensor) -> View2D:
    return _view_2d(t.shape, t.stride(), t.element_size())


def _view_2d(shape, strides, element_size: int) -> View2D:
    rows, heads, head_dim = shape
    row_stride, col_stride = strides[0], strides[1]
    if heads == 1:
        col_stride = head_dim  # the stride of a size-1 dim is arbitrary; never used for head 0
    width = (heads - 1) * col_stride + head_dim
    if rows == 1:
        per_16_bytes = 16 // element_size
        row_stride = -(-width // per_16_bytes) * per_16_bytes  # arbitrary too; rows past 0 are never read
    return View2D(rows, width, row_stride, col_stride)


def layout_problem(name: str, t: torch.Tensor) -> Optional[str]:
    """Why TMA cannot read ``t`` through a 2-D view, or None. TMA needs a 16-byte aligned base and
    16-byte multiple row strides; heads and rows must not overlap (a [T, 3, H, D] slice is fine)."""
    shape, strides = t.shape, t.stride()
    if len(shape) != 3 or strides[-1] != 1:
        return f"{name}: needs shape [T, H, D] with a contiguous last dim"
    if shape[0] == 0:
        return None  # never read (no descriptor is built over an empty tensor)
    es = t.element_size()
    view = _view_2d(shape, strides, es)
    if t.data_ptr() % 16:
        return f"{name}: TMA needs a 16-byte aligned base address"
    if (view.row_stride * es) % 16 or (view.col_stride * es) % 16:
        return f"{name}: TMA needs token and head strides that are multiples of 16 bytes, got {tuple(strides)}"
    if view.col_stride < shape[2] or view.row_stride < view.width:
        return f"{name}: heads or tokens overlap in memory (strides {tuple(strides)})"
    if view.rows >= 2**31:
        return f"{name}: more than 2**31 - 1 tokens (TMA coordinates are int32)"
    return None


def check_inputs(tensors: Mapping[str, Optional[torch.Tensor]], *, dtype: torch.dtype, head_dim: int,
                 head_dims: tuple, capability: tuple = (9, 0)) -> tuple[bool, str]:
    """(True, "") when a TLX kernel built for ``capability`` and ``head_dims`` can read ``tensors``
    (name -> tensor; None entries are skipped) on their device, else (False, why). Reads the launch
    target's capability (at call time only)."""
    if tlx is None:
        return False, f"triton.language.extra.tlx is not importable ({TLX_IMPORT_ERROR}); needs triton-utlx"
    if dtype not in DTYPES:
        return False, f"dtype {dtype} not supported (bf16 and fp16 only; fp32 stays on the portable kernel)"
    if head_dim not in head_dims:
        return False, f"head_dim {head_dim} not supported (only {head_dims})"
    first = next(t for t in tensors.values() if t is not None)
    target = target_for(first.device)
    if target is None:
        return False, (f"needs a CUDA tensor, got device {first.device} (CPU tensors run TLX kernels only "
                       "where the TLX simulator is installed: jfa.sim)")
    if tuple(target.capability) != tuple(capability):
        major, minor = capability
        return False, (f"needs an sm_{major}{minor} GPU, got sm_{target.capability[0]}{target.capability[1]}"
                       f" ({target.name})")
    for name, t in tensors.items():
        if t is not None:
            problem = layout_problem(name, t)
            if problem:
                return False, problem
    return True, ""


def sm_count(device: torch.device) -> int:
    """CTAs a persistent grid on ``device`` launches at most (its target's SM count)."""
    return target_for(device).sm_count


def descriptor(t: torch.Tensor, block_rows: int, block_cols: int = None):
    """(TMA descriptor over ``t`` as a 2-D view with boxes of ``block_rows`` x D (or ``block_cols``), column stride
    of a head)."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    view = view_2d(t)
    desc = TensorDescriptor(t, shape=[view.rows, view.width], strides=[view.row_stride, 1],
                            block_shape=[block_rows, block_cols or t.shape[2]])
    return desc, view.col_stride


def rebased(template, base: torch.Tensor):
    """The TMA descriptor ``template`` over ``base`` instead of its own base, without re-running the
    descriptor's checks: ``base`` must have the template base's dtype, shape, strides and 16-byte
    alignment (a call plan's key guarantees it: ``jfa.plans``)."""
    desc = object.__new__(type(template))
    desc.__dict__.update(template.__dict__)
    desc.base = base
    return desc


def make_variant(cls, switches: Mapping[str, str], source: str):
    """``cls(**switches)`` for a dataclass of ablation switches: bool fields (and optional ones, whose None
    means "the config's") parse 0/1/true/false, the others take the text; an unknown key is a ValueError
    naming ``source`` (the knob's variable)."""
    fields = [f.name for f in dataclasses.fields(cls)]
    types = get_type_hints(cls)  # the annotations resolved, whether or not they are strings
    values = {}
    for key, text in switches.items():
        if key not in fields:
            raise ValueError(f"{source}: unknown switch {key!r} (known: {fields})")
        boolean = types[key] in (bool, Optional[bool])
        values[key] = parse_bool(text, f"{source}: {key}") if boolean else text
    return cls(**values)


def offline_signature(kernel, constants: dict, types: dict) -> tuple[dict, dict]:
    """(signature, attrs) of ``kernel`` for an offline ``triton.compile``: constexprs from ``constants``,
    every other argument typed by ``types`` (name -> Triton type string) or "i32"; pointers and strides
    declared 16-divisible, as Triton specialises them at launch."""
    signature, attrs = {}, {}
    for index, name in enumerate(kernel.arg_names):
        signature[name] = "constexpr" if name in constants else types.get(name, "i32")
        if signature[name] != "constexpr" and (signature[name].startswith("*") or "stride" in name):
            attrs[(index,)] = [["tt.divisibility", 16]]
    return signature, attrs


_COUNTERS: dict = {}


def _stream_key(device: torch.device) -> tuple:
    if device.type == "cuda":
        return (device.type, device.index, torch.cuda.current_stream(device).cuda_stream)
    return (device.type, device.index, 0)


def work_counter(device: torch.device) -> torch.Tensor:
    """Two int32 words (next item, CTAs done) for the dynamic schedule (``common.device.fetch_item``), one
    pair per (device, stream) shared by every TLX kernel: zero before a launch and zeroed again by the
    launch's last CTA (``retire_counter``); launches on one stream run one after the other, so no memset
    is launched per call. Other devices (the simulator's CPU tensors) get a fresh zeroed pair per launch: a
    simulated launch that stopped part-way (a deadlock it reported) must not hand later launches a counter
    past their items."""
    if device.type != "cuda":
        return torch.zeros(2, dtype=torch.int32, device=device)
    key = _stream_key(device)
    if key not in _COUNTERS:
        _COUNTERS[key] = torch.zeros(2, dtype=torch.int32, device=device)
    return _COUNTERS[key]


def schedule_counter(dynamic: bool, device: torch.device, tiles: torch.Tensor) -> torch.Tensor:
    """A launch's COUNTER argument: the stream's work counter under the dynamic schedule; static schedules
    never read it, so ``tiles`` (any int32 tensor of the launch) stands in and nothing is allocated."""
    return work_counter(device) if dynamic else tiles
