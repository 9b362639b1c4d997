"""Shared by the CPU (simulator) and GPU tests of call plans: a case run twice through the public op on
one batch's offsets tensors, the second time with fresh values, as a training loop's next step would."""
import dataclasses

import torch

import jfa
from jfa.fuzz import rule
from jfa.fuzz.cases import make_inputs, offsets
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


# the selection rules of a block-sparse call that takes a plan
SPARSE_RULES = [dict(keep_ratio=0.5), dict(topk=2)]
SPARSE_RULE_IDS = ["keep-ratio", "topk"]


def sparse_planned_and_unplanned(selection: dict, device: str, monkeypatch):
    """(planned, unplanned, checks): a block-sparse call with a selection rule on one batch's offsets tensors,
    made with one set of values and then with another (planned), and the latter again with no plan
    (unplanned); each as (out, lse, dq, dk, dv). ``checks``: how many times each of the three calls checked
    its arguments. The two sets of values select different blocks (asserted), so a plan that kept the first
    call's lists would show."""
    from jfa import block_sparse
    from jfa.plans import plans

    lengths = (130, 0, 300, 1)
    cu = offsets(list(lengths), torch.int32).to(device)

    def values(seed):
        g = torch.Generator().manual_seed(seed)
        return [torch.randn(sum(lengths), 2, 64, generator=g).to(device=device, dtype=torch.bfloat16)
                for _ in range(3)]

    lists = [jfa.select_kv_blocks(*values(seed)[:2], cu, cu, max_seqlen_k=max(lengths), **selection)
             for seed in (1, 2)]
    used = [lst.indices[:int(lst.offsets[-1])].cpu() for lst in lists]
    assert not torch.equal(*used), "the two calls' values must select different blocks"

    counted = []
    validate_sparse = block_sparse._validate_sparse
    monkeypatch.setattr(block_sparse, "_validate_sparse",
                        lambda *a, **kw: counted.append(1) or validate_sparse(*a, **kw))

    def call(seed):
        q, k, v = (t.requires_grad_() for t in values(seed))
        before = len(counted)
        out, lse = jfa.block_sparse_attention(q, k, v, cu, cu, backend="tlx", deterministic=True, return_lse=True,
                                              **selection)
        out.backward(torch.ones_like(out))
        return (out, lse, q.grad, k.grad, v.grad), len(counted) - before

    plans.clear()
    _, first = call(1)
    planned, second = call(2)
    plans.clear()
    unplanned, third = call(2)
    return planned, unplanned, [first, second, third]
