"""Nitro: cheaper and faster distributed deep RL with serverless actors and boosting."""

__version__ = "0.1.0"
