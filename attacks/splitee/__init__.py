"""The accelerator's attacks on SpliTEE's split inference (paper 000, Table 6; docs/sequential_attack.md), reading only
the adversary view: the per-op inversion cell and its pipeline, the Bayes-optimal token attacker, the sequential
attacker, Slalom's mask reuse and the restored reconstructions (restored.py)."""
