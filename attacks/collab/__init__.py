"""The cloud's attacks on cloud-edge collaborative decoding (paper 003), reading only the adversary view."""
