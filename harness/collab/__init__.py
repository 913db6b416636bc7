"""Cloud-edge collaborative decoding (paper 003)."""
