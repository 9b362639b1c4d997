"""Shared by the CPU (simulator) and GPU tests of call plans: a case run twice through the public op on
one batch's offsets tensors, the second time with fresh values, as a training loop's next step would."""
import dataclasses

from jfa.fuzz import rule
from jfa.fuzz.cases import make_inputs
from jfa.kernels.tlx.hopper import backward as tlx_backward
from jfa.kernels.tlx.hopper import forward as tlx_forward

# one case of each structure a plan must carry: jagged with empty sequences, causal tails, broadcast Q,
# grouped heads, a strided fused projection with an expanded dout, a negative scale
PLANNED_CASES = ("empty-run-middle-bf16-D64", "tlx-tails-128-causal-bf16", "bcastq-causal-bf16-D128",
                 "gqa-causal-bf16-D64", "strided-fused-qkv", "scale-neg1.7-bf16-D64")


def planned_cases(catalogue) -> list:
    return [next(c for c in catalogue if c.name.startswith(prefix)) for prefix in PLANNED_CASES]


def spy_on_planned_launchers(monkeypatch) -> dict:
    """How often each planned launcher path ran and launched (a planned call that fell back counts 0)."""
    ran = {"forward": 0, "backward": 0}
    for name, cls in (("forward", tlx_forward._PlannedForward), ("backward", tlx_backward._PlannedBackward)):
        def spy(self, *args, _call=cls.__call__, _name=name):
            result = _call(self, *args)
            ran[_name] += result is not None
            return result

        monkeypatch.setattr(cls, "__call__", spy)
    return ran


def run_twice(case, device: str, monkeypatch):
    """(report of the first run, report of the second): both through ``rule.run_case`` on the TLX
    backend, the second on the first's offsets tensors with values from another seed."""
    first = make_inputs(case, device)
    monkeypatch.setattr(rule, "make_inputs", lambda *_a, **_k: first)
    first_report = rule.run_case(case, backend="tlx", device=device)
    second = dataclasses.replace(make_inputs(dataclasses.replace(case, seed=case.seed + 101), device),
                                 cu_q=first.cu_q, cu_k=first.cu_k)
    monkeypatch.setattr(rule, "make_inputs", lambda *_a, **_k: second)
    return first_report, rule.run_case(case, backend="tlx", device=device)
