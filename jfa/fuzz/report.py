"""The fuzzer's logs and reports: reading the workers' JSONL logs (incrementally, as a campaign runs),
writing ``summary.json`` / ``summary.md`` / ``junit.xml``, and merging the outputs of a campaign's
shards (``jfa fuzz merge DIR...``) into one report.

A worker log holds one JSON object per line:

- ``{"t", "start", "case"}``: an example is about to run (``start`` is its case, so the parent can
  write a case file for an example that hangs);
- ``{"t", "case", "ok", "ratio", "tensor", "kernel", "backward_kernel", "per_kernel", "seconds",
  "rechecked"}``: a judged example;
- ``{"t", "first_failure", "case"}``: the first failing example of a round, before shrinking;
- ``{"t", "failure", "case", "kind"}``: a case file written (kind: rule, crash, context-lost, hang);
- ``{"t", "skipped", "case"}``: an example not judged (the GPU ran out of memory);
- ``{"t", "compiling"}`` / ``{"t", "compiled"}``: a Triton compile began / ended (GPU workers: signs of
  life while an example waits on a cold compile);
- ``{"t", "error"}``: hypothesis itself failed a round; ``{"t", "worker"}``: a worker (re)started.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path
from xml.sax.saxutils import escape

# what makes two shard outputs one campaign: equal in every shard's summary.json
CAMPAIGN_KEYS = ("backend", "device", "mix", "oracle", "recheck_fraction", "max_tokens", "round_examples", "seed",
                 "shards", "mutant")
PRODUCTION_PREFIX = "tlx"  # forward kernels whose name starts so are the production (TLX) kernels


class LogStats:
    """Running totals over worker logs; :meth:`update` reads only what was appended since the last call
    (whole lines: a line being written is read next time)."""

    def __init__(self):
        self.examples = self.production = self.rechecked = self.failures = self.errors = self.skipped = 0
        self.worst, self.worst_case = 0.0, ""
        self.per_worker: dict = {}
        self.per_kernel: dict = {}
        self.first_failure_t = None
        self.last_row: dict = {}  # per log: the last row read (the parent's hang watch)
        self.last_start: dict = {}  # per log: the last "start" row (the example a hang is in)
        self._offsets: dict = {}

    def update(self, paths, label=lambda path: path.stem) -> "LogStats":
        for path in paths:
            with open(path, "rb") as f:
                f.seek(self._offsets.get(path, 0))
                data = f.read()
            end = data.rfind(b"\n") + 1
            self._offsets[path] = self._offsets.get(path, 0) + end
            for line in data[:end].splitlines():
                try:
                    row = json.loads(line)
                except json.JSONDecodeError:
                    continue
                self._add(label(path), row)
                self.last_row[path] = row
                if "start" in row:
                    self.last_start[path] = row
        return self

    def _add(self, worker: str, row: dict) -> None:
        if "ratio" in row:
            self.examples += 1
            self.per_worker[worker] = self.per_worker.get(worker, 0) + 1
            self.production += str(row.get("kernel", "")).startswith(PRODUCTION_PREFIX)
            self.rechecked += bool(row.get("rechecked"))
            if row["ratio"] > self.worst:
                self.worst, self.worst_case = row["ratio"], f"{row['tensor']} of {row['case']}"
            per_kernel = row.get("per_kernel") or {f"fwd {row.get('kernel') or '?'}": row["ratio"]}
            for name, ratio in per_kernel.items():
                kernel = self.per_kernel.setdefault(name, {"examples": 0, "worst": 0.0, "worst_case": ""})
                kernel["examples"] += 1
                if ratio > kernel["worst"]:
                    kernel["worst"], kernel["worst_case"] = ratio, row["case"]
        elif "first_failure" in row or "failure" in row:
            self.failures += "failure" in row
            if self.first_failure_t is None or row["t"] < self.first_failure_t:
                self.first_failure_t = row["t"]
        elif "skipped" in row:
            self.skipped += 1
        elif "error" in row:
            self.errors += 1

    def as_dict(self) -> dict:
        return {"examples": self.examples, "production_examples": self.production, "rechecked": self.rechecked,
                "failures": self.failures, "errors": self.errors, "skipped": self.skipped, "worst": self.worst,
                "worst_case": self.worst_case, "per_worker": self.per_worker, "per_kernel": self.per_kernel,
                "first_failure_t": self.first_failure_t}


def read_logs(out_dir: Path) -> dict:
    """The totals over every worker log in ``out_dir`` (see :class:`LogStats`)."""
    return LogStats().update(sorted(Path(out_dir).glob("worker-*.jsonl"))).as_dict()


def failure_files(out_dir: Path) -> list:
    failures = Path(out_dir) / "failures"
    return sorted(failures.glob("*.json")) if failures.exists() else []


def _share(part: int, whole: int) -> str:
    return f"{100.0 * part / whole:.0f}%" if whole else "-"


def write_reports(out_dir: Path, stats: dict, meta: dict) -> None:
    """``summary.json`` (meta and stats), ``summary.md`` (for people) and ``junit.xml`` (for CI) in ``out_dir``."""
    out_dir = Path(out_dir)
    seconds = max(meta.get("seconds", 0.0), 1e-9)
    found = stats.get("first_failure_t")
    summary = {**meta, **stats, "examples_per_minute": 60.0 * stats["examples"] / seconds,
               "seconds_to_first_failure": None if found is None else max(0.0, found - meta.get("start", found))}
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    failures = failure_files(out_dir)
    where = (f"{len(meta['merged_from'])} shard outputs merged, " if meta.get("merged_from") else
             f"shard {meta['shard']}, " if meta.get("shards", 1) > 1 and "shard" in meta else "")
    lines = [f"# jfa fuzz: {'FAILURES FOUND' if failures else 'no failure'}", "",
             f"- {where}backend {meta.get('backend')} on {meta.get('device')}, {meta.get('workers')} worker(s) "
             f"x {meta.get('threads', '?')} CPU thread(s), mix {meta.get('mix', '-')}, oracle {meta.get('oracle', '-')}"
             + (f", mutant {meta['mutant']}" if meta.get("mutant") else ""),
             f"- {seconds:.0f} s, {stats['examples']} judged examples ({summary['examples_per_minute']:.0f} a minute); "
             f"{_share(stats.get('production_examples', 0), stats['examples'])} on the production (TLX) kernels; "
             f"{stats.get('rechecked', 0)} re-judged by the NumPy oracle; {stats.get('skipped', 0)} skipped",
             f"- worst error/allowed: {stats['worst']:.3f} ({stats['worst_case']})"] + [
             f"  - kernel {name}: {k['examples']} examples, worst {k['worst']:.3f} ({k['worst_case']})"
             for name, k in sorted(stats["per_kernel"].items())] + [
             f"- failures: {len(failures)}" + ("" if found is None else
                                               f" (first after {summary['seconds_to_first_failure']:.1f} s)")] + [
             f"  - `jfa repro {p}`" for p in failures] + (
             [f"- stopped at the deadline (mid-example): worker(s) {meta['stopped_at_deadline']}"]
             if meta.get("stopped_at_deadline") else []) + (
             [f"- workers restarted: {meta['restarts']}"] if meta.get("restarts") else [])
    if meta.get("shard_rows"):
        lines += ["", "| shard | seconds | examples | a minute | failures |", "|---|---|---|---|---|"]
        lines += [f"| {r['shard']} | {r['seconds']:.0f} | {r['examples']} | {r['per_minute']:.0f} | {r['failures']} |"
                  for r in meta["shard_rows"]]
    (out_dir / "summary.md").write_text("\n".join(lines) + "\n")
    cases = [f'<testcase classname="jfa.fuzz" name="{escape(name)}" time="{seconds:.1f}">'
             f'<system-out>{n} examples</system-out></testcase>' for name, n in stats["per_worker"].items()]
    for p in failures:
        record = json.loads(p.read_text())
        detail = escape(json.dumps(record.get("verdicts", record.get("note", "")))[:4000])
        cases.append(f'<testcase classname="jfa.fuzz.failures" name="{escape(p.name)}">'
                     f'<failure message="replay: jfa repro {escape(str(p))}">{detail}</failure></testcase>')
    (out_dir / "junit.xml").write_text(
        f'<?xml version="1.0" encoding="utf-8"?>\n<testsuite name="jfa-fuzz" tests="{len(cases)}" '
        f'failures="{len(failures)}" time="{seconds:.1f}">\n' + "\n".join(cases) + "\n</testsuite>\n")


class MergeError(ValueError):
    """Shard outputs that are not one campaign (a summary missing, settings differing, a shard twice)."""


def merge(dirs, out_dir: Path) -> dict:
    """One report over the outputs of a campaign's shards: totals over every shard's logs, the shrunk
    failures deduplicated (a case file is named by the hash of its case, so the same shrunk case found
    by two shards is one file), per-shard rows. Raises :class:`MergeError` for outputs that are not
    shards of one campaign. Returns the merged summary."""
    metas = []
    for d in map(Path, dirs):
        path = d / "summary.json"
        if not path.exists():
            raise MergeError(f"{d}: no summary.json (not a jfa fuzz output, or the run did not finish)")
        metas.append((d, json.loads(path.read_text())))
    first_dir, first = metas[0]
    for d, meta in metas[1:]:
        for key in CAMPAIGN_KEYS:
            if meta.get(key) != first.get(key):
                raise MergeError(f"{d}: {key} = {meta.get(key)!r}, but {first_dir} has {first.get(key)!r}: "
                                 "not shards of one campaign")
    shards = [meta.get("shard", "0/1") for _, meta in metas]
    if len(set(shards)) != len(shards):
        raise MergeError(f"the same shard appears twice: {sorted(shards)}")
    out_dir = Path(out_dir)
    (out_dir / "failures").mkdir(parents=True, exist_ok=True)
    stats = LogStats()
    rows = []
    for d, meta in metas:
        stats.update(sorted(d.glob("worker-*.jsonl")), label=lambda p, s=meta.get("shard", "0/1"): f"shard {s} {p.stem}")
        for case_file in failure_files(d):
            target = out_dir / "failures" / case_file.name
            if not target.exists():
                shutil.copyfile(case_file, target)
        rows.append({"shard": meta.get("shard", "0/1"), "seconds": meta.get("seconds", 0.0),
                     "examples": meta.get("examples", 0), "failures": len(failure_files(d)),
                     "per_minute": 60.0 * meta.get("examples", 0) / max(meta.get("seconds", 0.0), 1e-9)})
    merged_meta = {key: first.get(key) for key in CAMPAIGN_KEYS}
    merged_meta.update(
        workers=sum(m.get("workers", 0) for _, m in metas), threads=first.get("threads", "?"),
        seconds=max(m.get("seconds", 0.0) for _, m in metas), start=min(m.get("start", 0.0) for _, m in metas),
        shard="merged", merged_from=[str(d) for d, _ in metas], shard_rows=sorted(rows, key=lambda r: r["shard"]),
        restarts=sum(m.get("restarts", 0) for _, m in metas),
        stopped_at_deadline=[f"{m.get('shard')}:{w}" for _, m in metas for w in m.get("stopped_at_deadline", [])])
    write_reports(out_dir, stats.as_dict(), merged_meta)
    return json.loads((out_dir / "summary.json").read_text())
