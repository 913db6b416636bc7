"""`splitbench-report DIR` (or `python -m runners.report DIR`): a run or sweep directory → report.md + PNGs.

    splitbench-report outputs/fidelity
    splitbench-report outputs --out docs/results/table2
    splitbench-report outputs/smoke --include-tagged smoke

Walks DIR for results.json, keeps finished runs (status ok and `.done`), leaves out runs tagged `smoke`
unless `--include-tagged smoke`, and writes report.md (atomically) with:
- a provenance header (models, workloads, prompts, git hashes, devices and TEE kind, dates, commands);
- Table 2 of the paper (fidelity vs the baseline, "mean [95% interval]"), one table per comparable group,
  with a plot of every utility metric against ε (fidelity.py);
- Table 1 / Fig. 4 (seconds per prompt by configuration, output limit and component), with stacked bars
  (timing.py);
- Table 4 (floating-point error against its bound, per ε, op type, precision and kernel; Down), with a
  plot of error and bound against ε (fp_error.py);
- Table 5 (controlled numerical error), with a plot of semantic similarity against mean absolute error
  (controlled_error.py);
- Table 6 (prompt reconstruction, the Bayes attacker, the privacy accounting), with the repeated-submission
  plot (attack.py);
- generic tables for experiments without a section (other.py), the runs covered, and the failed and
  unfinished runs (provenance.py).

Layout: runs.py finds and selects runs; format.py and plotting.py are shared; sections.py lists the
sections in report order; document.py walks it; cli.py is the command line.
"""
from runners.report.cli import main
from runners.report.document import ReportError, build

__all__ = ["ReportError", "build", "main"]
