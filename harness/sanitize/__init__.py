"""Token-level prompt sanitisers (paper 001)."""
