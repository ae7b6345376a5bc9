"""One trial: train and evaluate one delta spec on one task, reproducibly."""

from autopelt.train.settings import TrialSettings
from autopelt.train.trial import run_trial

__all__ = ["TrialSettings", "run_trial"]
