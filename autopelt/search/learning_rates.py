"""The rates a study has measured for each family, and a drawn delta's rate from them (rule 4 of
`autopelt.search.rate_policy`, which decides which source of a rate wins).

A single-method baseline that sweeps (`autopelt.train.lr_sweep`) measures its family's rate. A drawn delta's
`learning_rate: auto` becomes the geometric mean of the rates measured for its methods' families, times the
`lr_scale` the space draws; with none measured yet (prompt tuning alone, or drawn before the baselines finished) it
sweeps its own. So the sampler searches a narrow range around rates that learn on this task, model and budget,
instead of four decades of which most learn nothing.
"""

from __future__ import annotations

import math

from autopelt.delta.spec import AdaMixConfig, AdapterConfig, parse_spec

AUTO = "auto"  # a space's `learning_rate: auto`

# baseline preset -> the family whose rate it measures (UniPELT measures a combination, not a family)
BASELINE_FAMILIES = {"lora": "lora", "adapter": "adapter", "prefix": "prefix", "compacter": "compacter",
                     "bitfit": "bitfit", "prompt": "prompt"}


def family(entry) -> str:
    """The family a method entry's rate comes from: dense adapters share one, PHM/Compacter another; AdaMix
    trains at its inner delta's rate."""
    inner = entry.delta if isinstance(entry, AdaMixConfig) else entry
    if isinstance(inner, AdapterConfig):
        return "adapter" if inner.projection == "dense" else "compacter"
    return inner.method


def families(spec: dict) -> list[str]:
    return sorted({family(entry) for entry in parse_spec(spec).methods})


def measured(trials) -> dict[str, float]:
    """Family -> the rate its single-method baseline chose and trained to the end at, from TrialRecords; for a
    family no baseline measured, the rate of its best single-family portfolio member trained to the end."""
    rates, best = {}, {}
    for trial in trials:
        family_ = BASELINE_FAMILIES.get(trial.baseline or "")
        if family_ and trial.is_answer and trial.learning_rate:
            rates[family_] = trial.learning_rate
    for trial in trials:  # else the best single-family portfolio member's rate (its rate is absolute)
        if not (trial.portfolio and trial.is_answer and trial.learning_rate and trial.spec and trial.values):
            continue
        names = families(trial.spec)
        if len(names) == 1 and names[0] not in rates and trial.values[0] > best.get(names[0], (float("-inf"),))[0]:
            best[names[0]] = (trial.values[0], trial.learning_rate)
    return {**{name: rate for name, (_, rate) in best.items()}, **rates}


def reference_rate(spec: dict, rates: dict[str, float]) -> tuple[float | None, dict[str, float]]:
    """The geometric mean of the measured rates of the spec's families (those measured), and those rates;
    (None, {}) when no family of the spec has one yet."""
    known = {name: rates[name] for name in families(spec) if name in rates}
    if not known:
        return None, {}
    return math.exp(sum(math.log(rate) for rate in known.values()) / len(known)), known


def resolve(spec: dict, hparams: dict, rates: dict[str, float]) -> tuple[dict, dict]:
    """(training hyper-parameters with a learning rate, how it came about) for a drawn delta. A space's
    `learning_rate: auto` becomes the reference rate of the delta's families times `lr_scale`; with no reference
    yet, None: the trial sweeps its own (and `lr_scale` plays no part). A number stays as drawn."""
    hparams = dict(hparams)
    scale = hparams.pop("lr_scale", 1.0)
    if hparams.get("learning_rate") != AUTO:
        return hparams, {}
    reference, known = reference_rate(spec, rates)
    if reference is None:
        return {**hparams, "learning_rate": None}, {"how": "sweep", "scale": scale}
    return {**hparams, "learning_rate": reference * scale}, {"how": "baselines", "reference": reference,
                                                             "scale": scale, "families": known}
