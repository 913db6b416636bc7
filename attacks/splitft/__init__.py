"""The server's attacks on split federated fine-tuning (paper 002), reading only the adversary view."""
