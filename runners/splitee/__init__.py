"""SpliTEE's runners (harness/systems.py declares them): a package, where every other system has one
`runners/<system>.py`, because SpliTEE has eight: fidelity (paper Table 2), timing (Table 1), fp_error
(Table 4), controlled_error (Table 5), attack (Table 6), sequential_attack, restore (Table 7), and the
sensitivity table (§5.3) outside Hydra. Each is a recipe, one experiment each, as the other systems' one
runner is; one module would hold eight."""
