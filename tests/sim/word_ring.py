"""A word ring: the producer writes each item's words with generic shared-memory stores and two consumer
warpgroups read them, ordered by mbarriers alone (the TLX forward's item ring, ``item_ring.publish_item`` /
``take_item``). Each consumer writes how many items it saw whole. Imports no simulator, so that
tools/gpu/racecheck_probe.py can launch it on a GPU under compute-sanitizer; sim_kernels.py runs it on the
simulator.
"""
import triton
import triton.language as tl
import triton.language.extra.tlx as tlx

WORD_RING_BUGS = {"none": 0, "release_before_read": 1}  # 1: a consumer hands the slot back, then reads it


@triton.jit
def word_ring_kernel(OUT, N_ITEMS, BUG: tl.constexpr, SLOTS: tl.constexpr = 2, WORDS: tl.constexpr = 4):
    ring = tlx.local_alloc((1,), tl.int32, SLOTS * WORDS)
    fulls = tlx.alloc_barriers(num_barriers=SLOTS, arrive_count=1)
    empties = tlx.alloc_barriers(num_barriers=SLOTS, arrive_count=2)
    with tlx.async_tasks():
        with tlx.async_task("default"):  # producer: items 0 .. N_ITEMS - 1, then N_ITEMS (the end)
            for c in range(0, N_ITEMS + 1):
                b = c % SLOTS
                tlx.barrier_wait(empties[b], ((c // SLOTS) & 1) ^ 1)
                tlx.local_store(ring[b * WORDS], tl.zeros([1], dtype=tl.int32) + c)
                for w in tl.static_range(1, WORDS):
                    tlx.local_store(ring[b * WORDS + w], tl.zeros([1], dtype=tl.int32) + (c * 10 + w))  # <word-store>
                tlx.barrier_arrive(fulls[b], 1)
        with tlx.async_task(num_warps=4, replicate=2):  # consumers
            cid: tl.constexpr = tlx.async_task_replica_id()
            count = 0
            whole = 0
            b = count % SLOTS
            tlx.barrier_wait(fulls[b], (count // SLOTS) & 1)
            item = tl.max(tlx.local_load(ring[b * WORDS]), 0)
            while item < N_ITEMS:
                if BUG == 1:
                    tlx.barrier_arrive(empties[b], 1)
                ok = 1
                for w in tl.static_range(1, WORDS):
                    word = tl.max(tlx.local_load(ring[b * WORDS + w]), 0)  # <word-read>
                    ok = ok * (word == item * 10 + w).to(tl.int32)
                if BUG == 0:
                    tlx.barrier_arrive(empties[b], 1)
                whole += ok
                count += 1
                b = count % SLOTS
                tlx.barrier_wait(fulls[b], (count // SLOTS) & 1)
                item = tl.max(tlx.local_load(ring[b * WORDS]), 0)
            tl.store(OUT + tl.program_id(0) * 2 + cid, whole)
