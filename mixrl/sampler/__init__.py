"""mixrl.sampler: which prompts a step trains on, and which of their groups it keeps.

Layer 1 beside :mod:`mixrl.sources` (imports only :mod:`mixrl.core`, torch and the standard
library). Importing the package registers every component:

======================  ================  =====================================================
registry                 kind              module
======================  ================  =====================================================
``PICKERS``              prompt picker     ``pickers`` (data order, accuracy band, Thompson, bandit)
``GROUP_FILTERS``        group filter      ``group_filters`` (zero-variance, accuracy band)
``ROW_FILTERS``          row filter        ``row_filters`` (reward extremes, negative advantage)
======================  ================  =====================================================

:class:`~mixrl.sampler.state.PromptState` is the per-prompt history they read (times seen,
reward sums, Beta counts, last step); :class:`~mixrl.sampler.runtime.Sampler` ties them together
for the trainer (``mixrl.trainer.parts.sampler_rounds``) and is what a checkpoint saves.
"""

from mixrl.sampler import group_filters, pickers, row_filters  # noqa: F401  (import = registration)
from mixrl.sampler.group_filters import GROUP_FILTERS
from mixrl.sampler.pickers import PICKERS
from mixrl.sampler.row_filters import ROW_FILTERS
from mixrl.sampler.state import PromptState

__all__ = ["GROUP_FILTERS", "PICKERS", "ROW_FILTERS", "PromptState"]
