"""grounding: a Lightning experiment suite for visually grounded language.

Library code (models, losses, LightningModules, evaluation) lives here; data loading lives in
``data_modules``; configurations and sweeps live in ``experiments/``.
"""

__version__ = "0.1.0"

from grounding import renamed_modules as _renamed_modules

_renamed_modules.install()  # old module names (in checkpoints and run configs written before a rename) still import
