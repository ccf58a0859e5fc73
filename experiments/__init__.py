"""Experiment harness and one command per figure of the paper's evaluation (see figures.py)."""
