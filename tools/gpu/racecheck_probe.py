"""Does compute-sanitizer's racecheck see the ordering an mbarrier arrive/wait gives generic shared-memory
stores and loads? Launches the word ring of tests/sim/word_ring.py (the TLX forward's item ring protocol,
nothing else in the kernel) on the GPU; the simulator judges the correct ring race-free and the
``release_before_read`` one a race (tests/sim/test_sim_ring.py). Run under racecheck, both ways:

    compute-sanitizer --tool racecheck --report-api-errors no python3 tools/gpu/racecheck_probe.py
    compute-sanitizer --tool racecheck --report-api-errors no python3 tools/gpu/racecheck_probe.py release_before_read

Hazards on the correct ring mean racecheck does not model mbarrier ordering for generic accesses (the forward's
item ring and the dynamic schedule's item ring are then reported for the same reason). Prints what each
consumer counted (every item's words whole: the item count everywhere).

Outcome (H200, 2026-12-03, NOTES.md session 28): both rings are reported (the correct one 4 errors, 124 + 18
hazards; the early release 2 errors, 172 + 9), so racecheck cannot tell them apart.
"""
import importlib.util
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
_spec = importlib.util.spec_from_file_location("word_ring", os.path.join(HERE, "..", "..", "tests", "sim", "word_ring.py"))
word_ring = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(word_ring)

if __name__ == "__main__":
    bug = sys.argv[1] if len(sys.argv) > 1 else "none"
    items, ctas = 50, 4
    out = torch.full((ctas * 2,), -1, dtype=torch.int32, device="cuda")
    word_ring.word_ring_kernel[(ctas,)](out, items, BUG=word_ring.WORD_RING_BUGS[bug], num_warps=4, num_stages=1)
    torch.cuda.synchronize()
    print(f"word ring ({bug}): each consumer counted {out.tolist()} whole items of {items}")
