"""Every ``JFA_*`` environment setting, declared once: its variable, type, default and meaning.

Read a setting where it is used, when it is used (``knobs.trust_offsets``): its value is the one the
innermost open :func:`scope` gives it, else the process's (:func:`set_process`), else the environment
variable's (read at each access, so a variable set before a call takes effect), else the default.
Nothing else in jfa reads ``os.environ`` for these names, and nothing writes it: tests and measurements
set a value for a block of code with ``with jfa.knobs.scope(tlx_fused_dq=False): ...``.

A scope applies to the whole process while its block runs: the autograd engine runs a CUDA backward on
threads of its own, and those must see the setting the caller chose. Scopes nest; each one's settings
hold until its own block ends, whatever other blocks end in between. A value that does not parse is a
``ValueError`` naming the variable and what it accepts, so a typo never silently means the default.

``python -m jfa.knobs`` (or ``jfa info``) lists every setting with its current value.
"""
from __future__ import annotations

import contextlib
import json
import os
import threading
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Mapping, Optional, Union

_BOOLS = {"0": False, "false": False, "1": True, "true": True}

KernelSelection = Union[bool, frozenset]  # every TLX kernel (True), none (False), or these entry names
TLX_KERNELS = ("jagged_fwd_tlx_kernel", "jagged_dkdv_tlx_kernel")  # the names a selection may list


def parse_bool(text: str, source: str) -> bool:
    """``0``/``1``/``true``/``false`` (any case, spaces ignored); ValueError naming ``source`` otherwise."""
    try:
        return _BOOLS[text.strip().lower()]
    except KeyError:
        raise ValueError(f"{source}: must be 0, 1, true or false, got {text!r}") from None


def parse_switches(text: str, source: str) -> dict:
    """``"key=value,key=value"`` -> ``{key: value}`` (keys with ``-`` read as ``_``); ValueError on a part
    without ``=``. What the keys mean is the reader's business (the kernels' variants)."""
    switches = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, eq, value = part.partition("=")
        if not eq or not key.strip():
            raise ValueError(f"{source}: expected key=value pairs separated by commas, got {part!r}")
        switches[key.strip().replace("-", "_")] = value.strip()
    return switches


def parse_kernel_selection(text: str, source: str) -> KernelSelection:
    """A boolean (every TLX kernel or none) or comma-separated names of ``TLX_KERNELS``."""
    try:
        return parse_bool(text, source)
    except ValueError:
        names = frozenset(n.strip() for n in text.split(",") if n.strip())
        if not names or names - set(TLX_KERNELS):
            raise ValueError(f"{source}: must be 0, 1, true, false or comma-separated TLX kernel names "
                             f"{TLX_KERNELS}, got {text!r}") from None
        return names


def _choice(*choices: str) -> Callable[[str, str], str]:
    def parse(text: str, source: str) -> str:
        if text.strip() not in choices:
            raise ValueError(f"{source}: must be one of {choices}, got {text!r}")
        return text.strip()

    parse.__doc__ = f"one of {choices}"
    return parse


def _json_object(text: str, source: str) -> dict:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{source}: not valid JSON ({exc})") from None
    if not isinstance(value, dict):
        raise ValueError(f"{source}: expected a JSON object, got {type(value).__name__}")
    return value


@dataclass(frozen=True)
class Knob:
    """One setting: the environment variable, how its text parses, the default, what it does."""

    name: str  # the attribute: knobs.<name>
    env: str
    parse: Callable[[str, str], Any]
    default: Any
    doc: str

    def from_text(self, text: str) -> Any:
        return self.parse(text, self.env)


KNOBS: dict = {k.name: k for k in (
    Knob("trust_offsets", "JFA_TRUST_OFFSETS", parse_bool, False,
         "skip the one device read that checks offset values when both max_seqlen hints are given "
         "(CUDA-graph capture, torch.compile fullgraph); bad offsets are then undefined behaviour"),
    Knob("tlx_fused_dq", "JFA_TLX_FUSED_DQ", parse_bool, True,
         "the TLX backward reduces dQ inside its dK/dV kernel (TMA reduce-adds: dq's last bits vary run to "
         "run); 0 takes the portable dQ pass, as deterministic=True does per call"),
    Knob("tlx_variant", "JFA_TLX_VARIANT", parse_switches, {},
         "ablation switches of the TLX forward, key=value pairs (schedule=dynamic, long_causal_schedule=zigzag, "
         "persistent=0, longest_first=0, pingpong=0, peel=0, q_regs=0|1); measurements only"),
    Knob("tlx_bwd_variant", "JFA_TLX_BWD_VARIANT", parse_switches, {},
         "ablation switches of the TLX backward (persistent=0, dense_schedule=, masked_schedule=, "
         "sparse_schedule= static|dynamic, item_prefetch=short|always|never); measurements only"),
    Knob("tlx_own_waits", "JFA_TLX_OWN_WAITS", parse_kernel_selection, frozenset({"jagged_dkdv_tlx_kernel"}),
         "TLX kernels compiled without Triton's generic software pipeliner (their wgmma waits as written): "
         "0, 1 or kernel names; the default is what ships"),
    Knob("tlx_llvm_o0", "JFA_TLX_LLVM_O0", parse_kernel_selection, None,
         "TLX kernels whose LLVM IR skips LLVM's optimisation (left to ptxas): 0, 1 or kernel names; "
         "unset, each build does what its config asks"),
    Knob("triton_config", "JFA_TRITON_CONFIG", _json_object, None,
         'portable kernels\' 16-bit launch configs, {"forward": [block_m, block_n, warps, stages], '
         '"dkdv": [...], "dq": [...]}: a tuning aid for benchmark sweeps'),
    Knob("fuzz_profile", "JFA_FUZZ_PROFILE", _choice("ci", "ci-gpu", "ci-suite", "dev", "nightly"), "ci",
         "hypothesis profile of the property tests (jfa.fuzz.profiles)"),
    Knob("test_device", "JFA_TEST_DEVICE", _choice("cpu", "cuda"), "cpu",
         "default of pytest's --device option"),
)}

_UNSET = object()
_scopes: tuple = ()  # the open scopes' settings, innermost last (a dict each); replaced, never mutated
_process: dict = {}
_parsed: dict = {}  # (name, environment text) -> parsed value: the variable is read at each access, parsed once
_lock = threading.Lock()
_generation = 0  # bumped by every change of the scopes or the process settings (fingerprint)
_ENV_NAMES = tuple(k.env for k in KNOBS.values())
# os.environ's own table and its keys for our variables (CPython keeps the encoded table in ``_data``; a
# read there costs a dict lookup, os.environ.get ~40 times that: the fingerprint runs at every call)
_ENV_TABLE = getattr(os.environ, "_data", None)
_ENV_KEYS = tuple(os.environ.encodekey(name) for name in _ENV_NAMES) if _ENV_TABLE is not None else _ENV_NAMES


def _knob(name: str) -> Knob:
    try:
        return KNOBS[name]
    except KeyError:
        raise AttributeError(f"jfa.knobs has no setting {name!r} (known: {sorted(KNOBS)})") from None


def _normalise(knob: Knob, value: Any) -> Any:
    """A value given in code: text parses as the environment's would; None means the default."""
    if isinstance(value, str):
        return knob.from_text(value)
    if knob.parse is parse_kernel_selection and isinstance(value, (set, frozenset, list, tuple)):
        return knob.from_text(",".join(value))
    if knob.parse is parse_bool and not isinstance(value, bool):
        raise TypeError(f"{knob.env}: expected a bool, got {type(value).__name__}")
    if knob.parse is parse_switches and value is not None and not isinstance(value, Mapping):
        raise TypeError(f"{knob.env}: expected 'key=value,...' or a mapping, got {type(value).__name__}")
    return value


def get(name: str) -> Any:
    """The current value of setting ``name`` (see the module docstring for the order)."""
    knob = _knob(name)
    for layer in reversed(_scopes):
        if name in layer:
            return layer[name]
    value = _process.get(name, _UNSET)
    if value is not _UNSET:
        return value
    text = os.environ.get(knob.env, "")
    if not text.strip():
        return knob.default
    parsed = _parsed.get((name, text), _UNSET)  # (values are immutable: a memo of text -> value is safe)
    if parsed is _UNSET:
        parsed = _parsed[(name, text)] = knob.from_text(text)
    return parsed


def fingerprint() -> tuple:
    """A value that differs whenever any setting may read differently from when it was taken: the
    generation of the scopes and process settings and the environment's text of every variable. Caches of
    work that depends on settings (``jfa.plans``) key on it instead of reading each setting."""
    table = os.environ._data if _ENV_TABLE is not None else os.environ
    get_env = table.get
    return (_generation, *[get_env(key) for key in _ENV_KEYS])


def __getattr__(name: str) -> Any:  # knobs.trust_offsets etc.
    if name.startswith("__"):
        raise AttributeError(name)
    return get(name)


@contextlib.contextmanager
def scope(**values: Any) -> Iterator[None]:
    """Set settings for the block: ``with scope(tlx_fused_dq=False, tlx_variant="peel=0"):``. A value may
    be given typed or as the environment's text; ``None`` means the default (ignoring the environment and
    outer settings) for the block."""
    layer = {}
    for name, value in values.items():
        knob = _knob(name)
        layer[name] = knob.default if value is None else _normalise(knob, value)
    global _scopes, _generation
    with _lock:
        _scopes = _scopes + (layer,)
        _generation += 1
    try:
        yield
    finally:
        with _lock:  # this block's own layer, wherever it now is in the stack
            _scopes = tuple(other for other in _scopes if other is not layer)
            _generation += 1


def set_process(**values: Any) -> None:
    """Set settings for the whole process (every thread); ``None`` clears a process setting."""
    global _generation
    with _lock:
        for name, value in values.items():
            knob = _knob(name)
            if value is None:
                _process.pop(name, None)
            else:
                _process[name] = _normalise(knob, value)
        _generation += 1  # after the change: a fingerprint taken before it never names the new values


def describe() -> list:
    """``(variable, current value or the parse error, default, meaning)`` of every setting."""
    rows = []
    for knob in KNOBS.values():
        try:
            current: Optional[Any] = get(knob.name)
        except ValueError as exc:
            current = f"INVALID: {exc}"
        rows.append((knob.env, current, knob.default, knob.doc))
    return rows


if __name__ == "__main__":
    for env, current, default, doc in describe():
        print(f"{env:22s} {current!r:32s} (default {default!r})\n    {doc}")
