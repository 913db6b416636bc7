"""The returned-gradient audit (paper 004)."""
