"""Learning across tasks: a meta-dataset of a fixed design of deltas trained on many tasks, and the ordered
portfolio of configurations greedily chosen from it (auto-sklearn 2.0, TabRepo), run first by the search."""
