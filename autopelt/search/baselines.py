"""The baselines every study runs first: UniPELT(APL) and each single method at its paper's defaults.

They are queued as trials tagged with the user attribute `baseline` (the preset name; the spec comes from
`autopelt.delta.presets`), once per study: a later run queues only the ones no trial stands for yet.
"""

from __future__ import annotations

import optuna

from autopelt.search.claims import baseline_covered

# Learning rates in the range each method's paper used for base-size encoders on GLUE (adapters and
# UniPELT ~1e-4..5e-4, LoRA 5e-4, Compacter 3e-3, BitFit 1e-3, prompt tuning 3e-2), not tuned here.
# Other training settings are the trainer's defaults, and the epochs are the study's.
LEARNING_RATES = {
    "unipelt_apl": 5e-4,
    "unipelt_ap": 5e-4,
    "adapter": 1e-4,
    "houlsby": 1e-4,
    "prefix": 2e-4,
    "lora": 5e-4,
    "compacter": 3e-3,
    "compacter++": 3e-3,
    "bitfit": 1e-3,
    "prompt": 3e-2,
    "adamix": 4e-4,
}
DEFAULT_LEARNING_RATE = 1e-4


def baseline_hparams(name: str, epochs: int) -> dict:
    return {"learning_rate": LEARNING_RATES.get(name, DEFAULT_LEARNING_RATE), "epochs": epochs}


def enqueue_missing(study: optuna.Study, names: list[str]) -> list[str]:
    """Queue each baseline no trial stands for yet; the names queued."""
    trials = study.get_trials(deepcopy=False)
    missing = [name for name in names if not baseline_covered(name, trials)]
    for name in missing:
        study.enqueue_trial({}, user_attrs={"baseline": name})
    return missing
