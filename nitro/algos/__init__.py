"""Learning algorithms as pure tensor functions plus thin learner classes."""
