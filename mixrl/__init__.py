"""mixrl: mix on-policy RL with off-policy data, declared in config."""

import os as _os

# OpenMP threads that spin while waiting make small-tensor CPU training 5-10x slower as
# soon as another process shares the cores (measured); let them sleep instead. Set before
# torch is imported (mixrl's CLI imports this package first); a user's own setting wins.
_os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

__version__ = "0.1.0"
