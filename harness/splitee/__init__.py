"""SpliTEE (paper 000): split inference between a TEE and an untrusted accelerator.

The split engine: engine.py (SplitEngine and its settings, `engine._target_` in conf/splitee/default.yaml),
boundary.py (the one way out of the TEE), offload.py and architectures.py (which linear ops leave, on which
model families), mechanisms.py (plain, Gaussian, Slalom), noise_bank.py (the masks, in bounded memory) and
sensitivity.py (each op's Δ). Beyond it, what SpliTEE's runners compute: the privacy accounting
(accounting.py), the floating-point study (numerics/), the restoration of attacked text (restoration.py) and
the rotation of timed configurations (rotation.py).

The engine lived in harness/split/ until issue 30; runs finished before then hashed that path, and
harness/run_identity.py HASHED_AS keeps their config hashes.
"""
