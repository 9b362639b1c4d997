"""The event trace: with ``trace=True`` (or a size) every TLX op, copy landing and phase completion is
recorded in a bounded ring buffer; a failure renders its last events, and a LaunchReport can render
them after a successful launch (``report.render_trace(last=50)``).

An event is (sequence number, CTA, task, op, detail, site). Recording stores the raw values; the text
is built only when rendered.
"""
from __future__ import annotations

from collections import deque

DEFAULT_SIZE = 4096


class Tracer:
    def __init__(self, size: int = DEFAULT_SIZE):
        self.events: deque = deque(maxlen=max(16, int(size)))
        self.seq = 0

    def event(self, cta, task, op: str, detail, site) -> None:
        self.seq += 1
        self.events.append((self.seq, cta.index if cta is not None else None,
                            task.name if task is not None else "-", op, detail, site))

    def __len__(self) -> int:
        return len(self.events)

    def render(self, last: int = 50) -> list:
        events = list(self.events)[-last:] if last else list(self.events)
        out = []
        for seq, cta, task, op, detail, site in events:
            c = "" if cta is None else (f"cta{cta[0]}" if cta[1:] == (0, 0) else f"cta{cta}")
            where = f"  @ {site.short()}" if site else ""
            out.append(f"#{seq:<6} {c:<6} {task:<11} {op:<28} {detail}{where}")
        return out
