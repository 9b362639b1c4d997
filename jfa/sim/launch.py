"""Launch a TLX kernel on the simulator: argument binding, the interpreter patches of one launch, the
grid loop, and the LaunchReport.

For the duration of one launch (and only then; every patch is undone on exit, also on errors):

* ``triton.language`` runs on Triton's numpy interpreter (the interpreter's own patches, applied here
  with an exact undo);
* every TLX op of the architecture's op table replaces the ``tlx`` function of that name; every other
  TLX builtin raises UnsupportedError;
* a nested ``@triton.jit`` call runs the simulator's rewrite of the callee directly (the stock
  interpreter re-patches the language on every nested call, which dominated its run time);
* pointer loads, stores and atomics are checked against the launch's tensors and counted as steps;
  ``tl.range`` iterations are counted as steps.

The clusters of the grid run one after another, in the order ``dispatch.Dispatch`` starts them (launch order,
x outer, z inner, less the CTAs cluster launch control cancelled); a cluster's CTAs (``ctas_per_cga=(N, 1, 1)``
or ``num_ctas=N``; one CTA without) run concurrently, their tasks under one schedule (``cluster.Cluster``).
Concurrency between clusters is not modelled.
"""
from __future__ import annotations

import inspect
import re
import threading
import time
from dataclasses import dataclass, field
from typing import Optional

import numpy as np
import torch
import triton.language as tl
from triton.runtime import interpreter as _interp
from triton.tools.tensor_descriptor import TensorDescriptor

from . import rewrite, runtime, source
from .cluster import Cluster
from .cta import Cta
from .dispatch import Dispatch
from .errors import KernelError, ProtocolError, SimError, UnsupportedError
from .gmem import Descriptor, MemoryMap
from .ops import table_for
from .sched import Schedule
from .trace import DEFAULT_SIZE, Tracer

DEFAULT_MAX_STEPS = 2_000_000  # per CTA
DEFAULT_TIMEOUT_S = 300.0  # per launch
# keyword arguments of kernel[grid](...) that are launch options, not kernel parameters
_LAUNCH_OPTIONS = ("num_warps", "num_stages", "num_ctas", "maxnreg", "enable_fp_fusion", "launch_cooperative_grid",
                   "launch_pdl", "debug", "sanitize_overflow", "warp_size", "ctas_per_cga", "minRegAutoWS",
                   "maxRegAutoWS", "pingpongAutoWS")
_LOCK = threading.Lock()
_BUILTIN_NAMES: list = []


@dataclass
class LaunchReport:
    """What one simulated launch did."""

    kernel: str
    grid: tuple
    ctas: int
    schedule: str
    task_switches: int
    copies: int  # TMA copies (loads and stores) that landed
    op_counts: dict
    steps: list  # per CTA (per cluster in a launch of clusters), in launch order
    seconds: float
    warnings: list = field(default_factory=list)
    cancelled: tuple = ()  # x of every CTA a try_cancel claimed (it never started), in claim order
    tracer: Optional[Tracer] = field(default=None, repr=False)

    def render_trace(self, last: int = 50) -> str:
        if self.tracer is None:
            return "(no trace recorded: launch with trace=True)"
        return "\n".join(self.tracer.render(last))

    def summary(self) -> str:
        ops = sum(self.op_counts.values())
        cancelled = f" ({len(self.cancelled)} more cancelled by CLC)" if self.cancelled else ""
        return (f"{self.kernel} grid {self.grid}: {self.ctas} CTAs{cancelled}, {ops} TLX ops, "
                f"{self.task_switches} task switches, {self.copies} copies, {self.seconds:.3f} s ({self.schedule})"
                + (f", {len(self.warnings)} warning(s)" if self.warnings else ""))

    def __str__(self) -> str:
        return self.summary()


class _Patches:
    """Attribute patches with an exact undo (an attribute that was inherited is deleted again, not set)."""

    def __init__(self):
        self._undo: list = []

    def set_attr(self, obj, name, value) -> None:
        d = vars(obj)
        had = name in d
        self._undo.append((obj, name, had, d.get(name)))
        setattr(obj, name, value)

    def restore(self) -> None:
        while self._undo:
            obj, name, had, old = self._undo.pop()
            if had:
                setattr(obj, name, old)
            else:
                try:
                    delattr(obj, name)
                except AttributeError:
                    pass


def _nested_call(self, *args, **kwargs):
    """``InterpretedFunction.__call__`` during a launch: run the simulator's rewrite of the callee."""
    launch = runtime.ACTIVE
    if launch is None or threading.get_ident() not in launch.thread_ids:
        return _ORIGINAL_CALL(self, *args, **kwargs)
    return rewrite.rewritten(self.fn)(*args, **kwargs)


_ORIGINAL_CALL = _interp.InterpretedFunction.__call__


_OVERFLOW_OPS = {"add": np.add, "sub": np.subtract, "mul": np.multiply}


def _sanitize_overflow(lhs, rhs, binary_op):
    """The interpreter's integer-overflow check, in one numpy step. The stock version builds six tensor ops per
    integer add/sub/mul and then asserts only with ``debug`` on (off by default), so without ``debug`` it is
    pure cost (a third of a TLX kernel's run time); with ``debug`` this checks the same and raises the same."""
    sem = _interp.interpreter_semantic
    if not sem.builder.options.debug:
        return
    sca = lhs.type.scalar
    op = _OVERFLOW_OPS.get(getattr(binary_op, "__name__", ""))
    if sca.int_bitwidth >= 64 or op is None:
        return _STOCK_SANITIZE(sem, lhs, rhs, binary_op)
    r = op(lhs.handle.data.astype(np.int64), rhs.handle.data.astype(np.int64))
    if r.size and (int(r.max()) > sca.get_int_max_value() or int(r.min()) < sca.get_int_min_value()):
        raise AssertionError(f"int{sca.int_bitwidth} overflow detected for operation {binary_op.__name__}")


_STOCK_SANITIZE = type(_interp.interpreter_semantic).binary_op_sanitize_overflow_impl


def _install_fast_paths(p: _Patches) -> None:
    """Two hot spots of the interpreter, made cheap with the same results (a launch creates ~10^4-10^5
    tensors): uTLX's ``tl.tensor.__init__`` shim re-types IR values from their encoding, which an
    interpreter handle has none of (it pays a raised AttributeError per tensor); and the interpreter's
    ``_get_np_dtype`` builds its whole type table on every call."""
    init = tl.tensor.__init__
    inner = None
    if getattr(tl.tensor, "_utlx_encoding_shim", False):
        inner = inspect.getclosurevars(init).nonlocals.get("orig_init")
    if inner is not None:
        handle_type = _interp.TensorHandle

        def __init__(self, handle, type, _inner=inner, _outer=init):
            if handle.__class__ is handle_type:
                _inner(self, handle, type)
            else:
                _outer(self, handle, type)
        p.set_attr(tl.tensor, "__init__", __init__)

    stock = _interp._get_np_dtype
    cache: dict = {}

    def _get_np_dtype(tt_dtype):
        try:
            return cache[tt_dtype]
        except KeyError:
            pass
        except TypeError:  # unhashable: not cached
            return stock(tt_dtype)
        out = cache[tt_dtype] = stock(tt_dtype)
        return out
    p.set_attr(_interp, "_get_np_dtype", _get_np_dtype)

    # bf16 <-> fp32 casts: the interpreter's bit-field conversion equals a 16-bit shift (truncation
    # downwards, as the interpreter rounds with no rounding mode) for every value but subnormals
    convert = _interp._convert_float
    u32, u16 = np.uint32, np.uint16

    def _convert_float(input, input_dtype, output_dtype, rounding_mode):
        if input_dtype == tl.float32 and output_dtype == tl.bfloat16 and rounding_mode is None:
            bits = np.ascontiguousarray(input).view(u32)
            if not (((bits & u32(0x7F800000)) == 0) & ((bits & u32(0x7FFFFF)) != 0)).any():
                return (bits >> u32(16)).astype(u16).reshape(input.shape)
        elif input_dtype == tl.bfloat16 and output_dtype == tl.float32:
            bits = np.ascontiguousarray(input).view(u16)
            if not (((bits & u16(0x7F80)) == 0) & ((bits & u16(0x7F)) != 0)).any():
                return (bits.astype(u32) << u32(16)).reshape(input.shape)
        return convert(input, input_dtype, output_dtype, rounding_mode)
    p.set_attr(_interp, "_convert_float", _convert_float)


def _counting_range(original, launch):
    def range_(*args, **kwargs):
        r = original(*args, **kwargs)

        def gen():
            for i in r:
                s = launch.cta.sched
                s.steps += 1
                if s.steps > s.max_steps:
                    s._step_limit()
                yield i
        return gen()
    return range_


def _constexpr_params(fn) -> set:
    out = set()
    for name, p in inspect.signature(fn).parameters.items():
        ann = p.annotation
        if ann is tl.constexpr or (isinstance(ann, str) and ann.split(".")[-1] == "constexpr"):
            out.add(name)
    return out


def _tensors_of(name, value, out):
    if isinstance(value, torch.Tensor):
        out.append((name, value))
    elif isinstance(value, TensorDescriptor):
        _tensors_of(name, value.base, out)
    elif hasattr(value, "base") and isinstance(getattr(value, "base"), torch.Tensor) and hasattr(value, "data_ptr"):
        out.append((name, value.base))  # triton.reinterpret's TensorWrapper
    elif isinstance(value, (tuple, list)):
        for i, v in enumerate(value):
            _tensors_of(f"{name}[{i}]", v, out)


class Launch:
    """One simulated launch (one at a time per process)."""

    def __init__(self, kernel, *, schedule: Schedule, trace, arch, max_steps, timeout_s, sm_count=1):
        fn = getattr(kernel, "fn", None)
        if not isinstance(kernel, _interp.InterpretedFunction) or fn is None:
            raise UnsupportedError(
                f"launch: {getattr(kernel, '__name__', kernel)!r} is not an interpreted @triton.jit kernel: "
                "TRITON_INTERPRET=1 must be set before triton (and the kernel's module) is imported")
        self.kernel, self.fn = kernel, fn
        self.schedule = schedule
        self.tracer = Tracer(DEFAULT_SIZE if trace is True else int(trace)) if trace else None
        self.table = table_for(arch)
        self.arch = tuple(arch)
        self.max_steps = int(max_steps)
        self.timeout_s = float(timeout_s)
        self.sm_count = int(sm_count)
        self.dispatch: Optional[Dispatch] = None
        self.deadline = 0.0
        self.op_counts: dict = {}
        self.warnings: list = []
        self.cta: Optional[Cta] = None  # the CTA whose task runs now (a cluster switches it with its tasks)
        self.cluster_size = 1
        self.thread_ids: set = set()
        self.num_warps = 4
        self._descs: dict = {}
        self._desc_names: dict = {}
        self.memory: Optional[MemoryMap] = None

    # ---- helpers for the CTAs ---------------------------------------------------------------------------
    def warn(self, cta, message: str) -> None:
        self.warnings.append(f"CTA {cta.index[0] if cta.index[1:] == (0, 0) else cta.index}: {message}")

    def descriptor(self, handle, site) -> Descriptor:
        entry = self._descs.get(id(handle))
        if entry is None or entry[0] is not handle:
            name = self._desc_names.get(id(handle), "a device-side descriptor")
            entry = self._descs[id(handle)] = (handle, Descriptor(handle, name, self.memory))
        return entry[1]

    def _check_ptrs(self, ptrs, mask, what):
        s = self.cta.sched
        s.steps += 1
        if s.steps > s.max_steps:
            s._step_limit()
        p = ptrs.data
        if mask is not None:
            m = mask.data.astype(bool)  # (a mask built as `bool & bool` may arrive as integers 0/1)
            if m.size == 1:
                if not bool(m.reshape(-1)[0]):
                    return
            elif not m.all():
                p = p[np.broadcast_to(m, p.shape)]
        if p.size == 0:
            return
        es = max(1, ptrs.get_element_ty().primitive_bitwidth // 8)
        lo = int(p.min())
        if self.memory.contains(lo, int(p.max()) + es):
            return
        self.memory.check(p, es, what, source.capture(3))

    # ---- the launch -------------------------------------------------------------------------------------
    def run(self, grid, args, kwargs) -> LaunchReport:
        t0 = time.perf_counter()
        self.deadline = time.monotonic() + self.timeout_s
        fn = self.fn
        kwargs = dict(kwargs)
        self.num_warps = int(kwargs.pop("num_warps", 4) or 4)
        num_ctas = int(kwargs.pop("num_ctas", 1) or 1)
        ctas_per_cga = kwargs.pop("ctas_per_cga", None)
        for opt in _LAUNCH_OPTIONS:
            kwargs.pop(opt, None)
        cluster = _cluster_size(num_ctas, ctas_per_cga)
        sig = inspect.signature(fn)
        unknown = [k for k in kwargs if k not in sig.parameters]
        if unknown:
            raise TypeError(f"{fn.__name__}: unexpected keyword argument(s) {unknown}")
        bound = sig.bind(*args, **kwargs)
        bound.apply_defaults()
        constexprs = _constexpr_params(fn)
        tensors: list = []
        call_args = {}
        for name, value in bound.arguments.items():
            if name in constexprs:
                call_args[name] = value
                continue
            _tensors_of(name, value, tensors)
            try:
                call_args[name] = _interp._implicit_cvt(value)
            except AssertionError as exc:
                raise ProtocolError(f"argument {name}: the interpreter refuses it ({exc or 'assertion failed'}; a TMA "
                                    "descriptor needs a 16-byte aligned base and 16-byte multiple strides)") from exc
            if isinstance(value, TensorDescriptor):
                self._desc_names[id(call_args[name].handle)] = name
        for name, t in tensors:
            if t.device.type != "cpu":
                raise UnsupportedError(f"argument {name} is on {t.device}: the simulator runs CPU tensors")
        self.memory = MemoryMap(tensors)
        g = grid(dict(bound.arguments)) if callable(grid) else grid
        g = tuple(int(x) for x in (g if isinstance(g, (tuple, list)) else (g,)))
        if not 1 <= len(g) <= 3:
            raise ValueError(f"grid must have 1 to 3 dimensions, got {g}")
        g3 = g + (1,) * (3 - len(g))
        if num_ctas > 1:  # upstream's convention: the grid counts clusters
            g3 = (g3[0] * num_ctas,) + g3[1:]
            g = (g3[0],) + tuple(g[1:])
        if g3[0] % cluster:
            raise ProtocolError(f"grid {g}: with clusters of {cluster} CTAs (ctas_per_cga) the grid's x must be a "
                                "whole number of clusters")
        self.cluster_size = cluster
        rfn = rewrite.rewritten(fn)

        steps, switches, copies, ctas = [], 0, 0, 0
        with _LOCK:
            patches = _Patches()
            threads = torch.get_num_threads()
            try:
                # one intra-op thread: the products are small, and a multi-threaded BLAS on a loaded machine
                # (CI runs two test workers on two cores) spins for milliseconds per product
                torch.set_num_threads(1)
                self._install(patches)
                runtime.ACTIVE = self
                _interp.interpreter_builder.set_grid_dim(*g3)
                self.dispatch = Dispatch(g3, self.sm_count, self.schedule.dispatch_rng(),
                                         self.schedule.land_prob, cluster=cluster)
                while (index := self.dispatch.next_cta()) is not None:
                    _interp.interpreter_builder.set_grid_idx(*index)
                    if cluster == 1:
                        cta = self.cta = Cta(self, index)
                        unit, n = cta, 1
                    else:
                        unit = Cluster(self, [(index[0] + r,) + index[1:] for r in range(cluster)])
                        cta = self.cta = unit.ctas[0]
                        n = cluster
                    try:
                        unit.run(rfn, call_args)
                    except BaseException as exc:  # noqa: BLE001
                        failing = unit.sched.error_task.cta if unit.sched.error_task is not None else cta
                        raise self._annotate(exc, failing or cta, g) from None
                    finally:
                        self.thread_ids.clear()
                    ctas += n
                    steps.append(unit.sched.steps)
                    switches += unit.sched.switches
                    copies += unit.sched.landed
                    self.dispatch.cta_done()
            finally:
                runtime.ACTIVE = None
                self.cta = None
                patches.restore()
                torch.set_num_threads(threads)
        return LaunchReport(kernel=fn.__name__, grid=g, ctas=ctas, schedule=self.schedule.describe(),
                            task_switches=switches, copies=copies, op_counts=dict(self.op_counts), steps=steps,
                            cancelled=tuple(self.dispatch.cancelled),
                            seconds=time.perf_counter() - t0, warnings=list(self.warnings), tracer=self.tracer)

    def _annotate(self, exc: BaseException, cta: Cta, grid) -> BaseException:
        err = exc
        while err is not None and not isinstance(err, SimError):  # unwrap an interpreter wrapper
            err = err.__cause__
        if err is None:
            if not isinstance(exc, Exception):
                return exc  # KeyboardInterrupt and friends
            err = KernelError(f"the kernel raised {type(exc).__name__}: {exc}", site=source.from_traceback(exc.__traceback__))
            err.__cause__ = exc
        err.kernel = err.kernel or self.fn.__name__
        err.cta = err.cta or cta.index
        err.grid = err.grid or grid
        err.schedule = err.schedule or self.schedule.describe()
        task = cta.sched.error_task
        from .errors import DeadlockError
        if err.task is None and task is not None and not isinstance(err, DeadlockError):
            err.task = task.name
        if self.tracer is not None and not err.events:
            err.events = self.tracer.render(40)
        return err

    def _install(self, p: _Patches) -> None:
        import triton.language.extra.tlx as tlx_module

        b = _interp.interpreter_builder
        # triton.language on the interpreter, as its GridExecutor does, but with an exact undo
        # (both modules: Triton's own @jit library functions, e.g. tl.zeros, call tl.core's builtins)
        langs = [tl, tl.core]
        for lang in langs:
            _interp._patch_builtin(lang, b, p)
            _interp._patch_builtin(lang.tensor, b, p)
            if lang is tl:
                _interp._patch_builtin(lang.math, b, p)
            _interp._patch_lang_tensor(lang.tensor, p)
            _interp._patch_lang_core(lang, p)
        _interp._patch_builtin(tl.core.tensor_descriptor_base, b, p)
        for lang in langs:
            p.set_attr(lang, "range", _counting_range(lang.range, self))
        # the TLX ops
        if not _BUILTIN_NAMES:
            _BUILTIN_NAMES.extend(n for n in dir(tlx_module) if tl.core.is_builtin(getattr(tlx_module, n)))
        for name in _BUILTIN_NAMES:
            spec = self.table.ops.get(name)
            p.set_attr(tlx_module, name, self._proxy(spec) if spec is not None else self._stub(name))
        for name, spec in self.table.ops.items():
            if name not in _BUILTIN_NAMES:
                p.set_attr(tlx_module, name, self._proxy(spec))
        # nested @triton.jit calls, pointer accesses
        p.set_attr(_interp.InterpretedFunction, "__call__", _nested_call)
        load, store, rmw, cas = b.create_masked_load, b.create_masked_store, b.create_atomic_rmw, b.create_atomic_cas
        launch = self

        def masked_load(ptrs, mask, other, cache_modifier, eviction_policy, is_volatile):
            launch._check_ptrs(ptrs, mask, "tl.load")
            return load(ptrs, mask, other, cache_modifier, eviction_policy, is_volatile)

        def masked_store(ptrs, value, mask, cache_modifier, eviction_policy):
            launch._check_ptrs(ptrs, mask, "tl.store")
            return store(ptrs, value, mask, cache_modifier, eviction_policy)

        def atomic_rmw(op, ptr, val, mask, sem, scope):
            launch._check_ptrs(ptr, mask, "atomic")
            return rmw(op, ptr, val, mask, sem, scope)

        def atomic_cas(ptr, cmp, val, sem, scope):
            launch._check_ptrs(ptr, None, "atomic_cas")
            return cas(ptr, cmp, val, sem, scope)

        p.set_attr(b, "create_masked_load", masked_load)
        p.set_attr(b, "create_masked_store", masked_store)
        p.set_attr(b, "create_atomic_rmw", atomic_rmw)
        p.set_attr(b, "create_atomic_cas", atomic_cas)
        p.set_attr(b, "create_inline_asm", self._inline_asm)
        p.set_attr(_interp.interpreter_semantic, "binary_op_sanitize_overflow_impl", _sanitize_overflow)
        _install_fast_paths(p)

    def _proxy(self, spec):
        fn, name, launch = spec.fn, spec.name, self
        if spec.sync:
            def op(*args, **kwargs):
                if kwargs:
                    kwargs.pop("_semantic", None)
                cta = launch.cta
                cta.enter(name)
                return fn(cta, *args, **kwargs)
        else:
            def op(*args, **kwargs):
                if kwargs:
                    kwargs.pop("_semantic", None)
                return fn(launch.cta, *args, **kwargs)
        op.__name__ = name
        return op

    def _stub(self, name):
        arch = f"sm_{self.arch[0]}{self.arch[1]}"

        def op(*args, **kwargs):
            raise UnsupportedError(f"tlx.{name} is not simulated on {arch}", site=source.capture(2))
        op.__name__ = name
        return op

    def _inline_asm(self, asm, constraints, values, types, is_pure, pack):
        """The inline-asm reads a profiling build uses, as scalars: %globaltimer and %clock64 (both host ns)
        and %smid (the CTA's index); the paired 16-bit conversions (``cvt.rn.bf16x2.f32``/``cvt.rn.f16x2.f32``
        of two fp32 elements, round to nearest even like the cast); any other asm is refused."""
        pair = re.fullmatch(r"cvt\.rn\.(bf16|f16)x2\.f32 \$0, \$2, \$1;", asm.strip())
        if pair and pack == 2 and len(values) == 1 and len(types) == 1:
            dst = types[0].scalar if hasattr(types[0], "scalar") else types[0]
            if str(values[0].dtype.scalar) != "fp32" or str(dst) != {"bf16": "bf16", "f16": "fp16"}[pair.group(1)]:
                raise UnsupportedError(f"inline asm {asm!r} on {values[0].dtype} -> {dst}: it converts fp32 to "
                                       f"{pair.group(1)}", site=source.capture(2))
            return _AsmCall([_interp.interpreter_builder.cast_impl(values[0], types[0])])
        if values or len(types) != 1:
            raise UnsupportedError(f"inline asm {asm!r} is not simulated", site=source.capture(2))
        if "%globaltimer" in asm or "%clock64" in asm:  # (no cycles here: a monotone clock stands in)
            v = time.monotonic_ns()
        elif "%smid" in asm:
            v = self.cta.index[0]
        else:
            raise UnsupportedError(f"inline asm {asm!r} is not simulated", site=source.capture(2))
        dtype = types[0].scalar if hasattr(types[0], "scalar") else types[0]
        return _AsmCall([_interp.TensorHandle(np.array([v], dtype=_interp._get_np_dtype(dtype)), dtype)])


class _AsmCall:
    def __init__(self, results):
        self.results = results

    def get_result(self, i):
        return self.results[i]


def _cluster_size(num_ctas: int, ctas_per_cga) -> int:
    """The CTAs per cluster a launch asks for: uTLX's ``ctas_per_cga=(N, 1, 1)`` or upstream's ``num_ctas=N``."""
    n = 1
    if ctas_per_cga is not None:
        dims = tuple(int(d) for d in ctas_per_cga)
        if len(dims) != 3 or dims[1] != 1 or dims[2] != 1 or dims[0] < 1:
            raise ProtocolError(f"ctas_per_cga={ctas_per_cga!r}: uTLX launches clusters of (N, 1, 1) only")
        if num_ctas != 1 and dims[0] != 1:
            raise ProtocolError("num_ctas and ctas_per_cga name the same cluster with opposite grid conventions: "
                                "give one of them")
        n = dims[0]
    if num_ctas != 1:
        n = num_ctas
    if not 1 <= n <= 16:
        raise ProtocolError(f"a cluster of {n} CTAs: 1 to 16 (8 portable)")
    return n


def launch(kernel, grid, *args, schedule: Schedule = None, trace=False, arch=(9, 0), max_steps=DEFAULT_MAX_STEPS,
           timeout_s=DEFAULT_TIMEOUT_S, sm_count=1, **kwargs) -> LaunchReport:
    """Run ``kernel[grid](*args, **kwargs)`` on the simulator and return its LaunchReport.

    ``schedule``: ``Schedule.deterministic()`` (default) or ``Schedule.seeded(seed)``; ``trace``: record
    events (True, or the ring's size); ``arch``: the compute capability whose op table runs (Hopper);
    ``max_steps``: per CTA; ``timeout_s``: the wall-clock limit of the launch; ``sm_count``: the CTAs resident
    from the start (``dispatch.Dispatch``: what cluster launch control can no longer cancel). Raises a SimError
    subclass for every finding."""
    L = Launch(kernel, schedule=schedule or Schedule.deterministic(), trace=trace, arch=arch, max_steps=max_steps,
               timeout_s=timeout_s, sm_count=sm_count)
    return L.run(grid, args, kwargs)
