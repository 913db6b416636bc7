"""SpliTEE (paper 000): what its runners compute beyond the split engine (harness/split/, which keeps its
place: `engine._target_` names harness.split.engine.EngineSettings in every SpliTEE run's config hash and
results.json): the privacy accounting, the floating-point study (numerics/), the restoration of attacked
text and the rotation of timed configurations."""
