"""Split federated fine-tuning (paper 002)."""
