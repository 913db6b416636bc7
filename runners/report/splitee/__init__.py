"""SpliTEE's report sections (harness/systems.py's report_sections, in report.md's order) and what they
share: a package, where every other system has one `runners/report/<system>.py`, because SpliTEE has one
section per runner (runners/splitee/), plus the fidelity rows and example responses under Table 2, the
per-configuration verdicts.json and the ε-of-50 % table of the sequential attack."""
