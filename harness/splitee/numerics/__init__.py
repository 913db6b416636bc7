"""The floating-point study of SpliTEE's unmasking (paper §5.5, §7.3.2, Tables 4 and 5), outside the engine.

    precisions.py        working precisions: unit roundoff, Higham's γ_n, rounding to the working dtype
    bound.py             the proven bound on the unmasking error (docs/fp_bound.md §3-§4)
    reference.py         the exact reference ⟨w, x⟩ and how far it can be off (docs/fp_bound.md §4)
    kernels.py           the working-precision kernels evaluated (library, sequential) and the accumulation probe
    op_inputs.py         the real inputs of every op instance, captured from a T3 generation (and cached)
    study.py             op instances with their σ, the trials, and the whole protocol (docs/fp_bound.md §7)
    summary.py           trials pooled into Table 4's rows and results.json's flat metrics
    controlled_error.py  the engine output hook that rescales each call's natural error (Table 5)

These modules read the engine (harness/splitee/engine.py and its parts); the engine imports nothing from them.
"""
