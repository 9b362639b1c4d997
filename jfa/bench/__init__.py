"""Benchmarks for jagged attention: suites as data, implementation adapters, a runner, reports.

``python -m jfa.bench --suite gem --dry-run`` lists the DESIGN.md section 6 problems and the
implementations (with why any is unavailable or does not apply) on any machine; without
``--dry-run`` it needs a CUDA GPU. Importing this package never touches CUDA.
"""

from .impls import (BASELINE, IMPLS, Impl, NotApplicable, PackedBatch, Prepared, expand_broadcast_q,
                    get_impl, varlen_causal_kwargs)
from .report import format_table, markdown_report, write_csv, write_outputs, write_plots
from .runner import dry_run, main, run_suite, write_reports
from .suites import PASSES, SUITES, Problem, flops, get_suite, make_lengths, q_lengths, visible_pairs

__all__ = [
    "BASELINE", "IMPLS", "Impl", "NotApplicable", "PackedBatch", "Prepared", "expand_broadcast_q",
    "get_impl", "varlen_causal_kwargs",
    "format_table", "markdown_report", "write_csv", "write_outputs", "write_plots",
    "dry_run", "main", "run_suite", "write_reports",
    "PASSES", "SUITES", "Problem", "flops", "get_suite", "make_lengths", "q_lengths", "visible_pairs",
]
