"""mixrl: mix on-policy RL with off-policy data, declared in config."""

__version__ = "0.1.0"
