"""tunebank: transfer tuning for deep-learning subgraphs."""
