"""Attacks on token-level sanitisers (paper 001): they read only the sanitised tokens of the adversary view
(channel `sanitized_tokens`) plus what the threat model makes public (the embedding table, the mechanism and
its parameters). neighbours.py: the paper's Pr@5; bayes.py: the mechanism-aware posterior P(t | t');
contextual.py: that posterior times the victim LM's prior over the sequence, by beam search;
window.py: Stencil's window inverter; learned.py: a ridge inverter and decoder.py: the attack suite's
learned decoder, both trained on public text sanitised by the attacker; scoring.py: metrics, controls and
the verdict; suite.py: all of them on one view."""
