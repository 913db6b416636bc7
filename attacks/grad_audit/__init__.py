"""The cloud's attacks on the returned gradient (paper 004), reading only the adversary view."""
