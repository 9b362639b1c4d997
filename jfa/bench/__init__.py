"""Benchmarks for jagged attention: suites as data, implementation adapters, a runner.

``python -m jfa.bench --suite gem --dry-run`` lists the DESIGN.md section 6 problems on any
machine; without ``--dry-run`` it needs a CUDA GPU. Importing this package never touches CUDA.
"""

from .impls import BASELINE, IMPLS, Impl, PackedBatch, Prepared, get_impl, varlen_causal_kwargs
from .runner import dry_run, format_table, main, markdown_report, run_suite
from .suites import SUITES, Problem, flops, get_suite, make_lengths, q_lengths, visible_pairs

__all__ = [
    "BASELINE", "IMPLS", "Impl", "PackedBatch", "Prepared", "get_impl", "varlen_causal_kwargs",
    "dry_run", "format_table", "main", "markdown_report", "run_suite",
    "SUITES", "Problem", "flops", "get_suite", "make_lengths", "q_lengths", "visible_pairs",
]
