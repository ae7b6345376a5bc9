"""A small synthetic study holding every kind of record a real search writes (docs/architecture.md, "A study").

The report's tests check exact numbers on it, `scripts/report_screenshot.py` draws it, and anyone can point
`autopelt report` / `autopelt dashboard` at it to see what they show without training anything:

    PYTHONPATH=tests python -m support.example_study sqlite:///example.db   # then: autopelt report --study example ...

The core trials (their numbers are what the tests expect):

    #0..5  baselines unipelt_apl (gated), adapter, prefix, lora, compacter, bitfit, all COMPLETE
    #6     searched LoRA, COMPLETE          #9   searched UniPELT (gated), COMPLETE, the best
    #7     searched, PRUNED at epoch 1/3    #10  searched LoRA + BitFit, COMPLETE
    #8     searched, FAIL (out of memory)   #11  searched, FAIL (over the parameter budget, never trained)
    #12    WAITING (queued, not started)

Pareto front (dev up, params % down): #4, #10, #3, #6, #9. `extra` adds that many more searched trials
(seeded, numbered from 13) so that the figures look like a real study's.
"""

from __future__ import annotations

import random
import sys

import optuna
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.trial import TrialState, create_trial

STUDY = "example"
METRIC = "accuracy"
MAX_FIDELITY = 3
LAYERS = 6

RANK = CategoricalDistribution([1, 2, 4, 8, 16])
LEARNING_RATE = FloatDistribution(1e-5, 1e-2, log=True)
BOTTLENECK = IntDistribution(8, 64, step=8)
PREFIX = IntDistribution(5, 20, step=5)

# (baseline, summary, methods, dev, params %, gated)
BASELINES = [
    ("unipelt_apl", "adapter b48 + prefix L10 + lora r8 (gated)", ["adapter", "prefix", "lora"], 0.70, 1.20, True),
    ("adapter", "adapter b48", ["adapter"], 0.66, 0.90, False),
    ("prefix", "prefix L10", ["prefix"], 0.60, 0.15, False),
    ("lora", "lora r8 q,v", ["lora"], 0.64, 0.25, False),
    ("compacter", "compacter n4", ["adapter"], 0.62, 0.05, False),
    ("bitfit", "bitfit", ["bitfit"], 0.58, 0.08, False),
]


def gates(seed: int, kinds=("adapter", "prefix", "lora"), as_lists: bool = False) -> dict:
    """Mean gate values per kind and layer, rising with depth for adapters (as UniPELT reports)."""
    rng = random.Random(seed)
    out = {}
    for k, kind in enumerate(kinds):
        values = [round(min(0.95, max(0.05, 0.3 + 0.08 * layer * (1 - k / 2) + rng.uniform(-0.1, 0.1))), 3)
                  for layer in range(LAYERS)]
        out[kind] = values if as_lists else {str(layer): value for layer, value in enumerate(values)}
    return out


def attrs(summary: str, methods: list[str], pct: float, dev: float | None, fidelity: int = MAX_FIDELITY,
          **extra) -> dict:
    stored = int(round(pct / 100 * 22_713_216))
    out = {
        "spec": {"methods": [{"method": m} for m in methods]}, "summary": summary, "methods": methods,
        "params_stored": stored, "params_trainable": stored, "params_pct": pct,
        "fidelity": fidelity, "max_fidelity": MAX_FIDELITY, "full_fidelity": fidelity == MAX_FIDELITY,
        "result_dir": "runs/example/trial", "seconds": 40.0 * fidelity,
        "hparams": {"learning_rate": 5e-4, "epochs": MAX_FIDELITY},
    }
    if dev is not None:
        out["dev"] = {METRIC: dev}
        out["test"] = {METRIC: round(dev - 0.01, 4)}
    out.update(extra)
    return out


def values(dev: float, pct: float, multi_objective: bool) -> list[float]:
    return [dev, pct] if multi_objective else [dev]


def core_trials(multi_objective: bool = False) -> list:
    mo = multi_objective
    trials = [
        create_trial(values=values(dev, pct, mo), user_attrs=attrs(
            summary, methods, pct, dev, baseline=name, **({"gates": gates(0, as_lists=True)} if gated else {})))
        for name, summary, methods, dev, pct, gated in BASELINES
    ]
    lora = {"lora.rank": RANK, "learning_rate": LEARNING_RATE}
    unipelt = {"lora.rank": RANK, "learning_rate": LEARNING_RATE, "adapter.bottleneck": BOTTLENECK,
               "prefix.length": PREFIX}
    pruned_attrs = attrs("lora r1 q,v", ["lora"], 0.02, None, fidelity=1, stopped_by="early stopping",
                         full_fidelity=False)
    if mo:
        pruned_attrs["intermediate"] = {"1": 0.52}
    trials += [
        create_trial(values=values(0.67, 0.30, mo), params={"lora.rank": 8, "learning_rate": 3e-4},
                     distributions=lora, user_attrs=attrs("lora r8 q,k,v", ["lora"], 0.30, 0.67)),
        create_trial(state=TrialState.PRUNED, params={"lora.rank": 1, "learning_rate": 2e-5}, distributions=lora,
                     intermediate_values={} if mo else {1: 0.52}, user_attrs=pruned_attrs),
        create_trial(state=TrialState.FAIL, params={"lora.rank": 16, "learning_rate": 1e-3}, distributions=lora,
                     user_attrs=attrs("lora r16 all", ["lora"], 0.50, None, fidelity=0, full_fidelity=False,
                                      fail_reason="CUDA out of memory. Tried to allocate 2.00 GiB")),
        create_trial(values=values(0.72, 0.40, mo), distributions=unipelt,
                     params={"lora.rank": 4, "learning_rate": 6e-4, "adapter.bottleneck": 16, "prefix.length": 5},
                     user_attrs=attrs("adapter b16 + prefix L5 + lora r4 (gated)", ["adapter", "prefix", "lora"],
                                      0.40, 0.72, gates=gates(9))),
        create_trial(values=values(0.63, 0.10, mo), params={"lora.rank": 2, "learning_rate": 1e-3},
                     distributions=lora, user_attrs=attrs("lora r2 q,v + bitfit", ["lora", "bitfit"], 0.10, 0.63)),
        create_trial(state=TrialState.FAIL, params={"lora.rank": 16, "learning_rate": 1e-4}, distributions=lora,
                     user_attrs=attrs("lora r16 all + adapter b64", ["lora", "adapter"], 5.0, None, fidelity=0,
                                      full_fidelity=False, fail_reason="over parameter budget: 5.0% > 1%")),
    ]
    return trials


def extra_trials(count: int, multi_objective: bool = False, seed: int = 0) -> list:
    """Plausible searched trials: bigger deltas score a little higher, a quarter are stopped early."""
    rng = random.Random(seed)
    lora = {"lora.rank": RANK, "learning_rate": LEARNING_RATE}
    out = []
    for i in range(count):
        rank, lr = rng.choice(RANK.choices), 10 ** rng.uniform(-5, -2)
        pct = round(rank * 0.031 * rng.uniform(0.8, 1.3), 3)
        dev = round(0.55 + 0.03 * (rank.bit_length()) - 6 * abs(lr - 8e-4) + rng.uniform(-0.03, 0.03), 4)
        params = {"lora.rank": rank, "learning_rate": lr}
        summary = f"lora r{rank} q,v"
        if rng.random() < 0.25:
            user_attrs = attrs(summary, ["lora"], pct, None, fidelity=1, full_fidelity=False,
                               stopped_by="early stopping")
            early = round(dev - 0.06, 4)
            if multi_objective:
                user_attrs["intermediate"] = {"1": early}
            out.append(create_trial(state=TrialState.PRUNED, params=params, distributions=lora,
                                    intermediate_values={} if multi_objective else {1: early}, user_attrs=user_attrs))
        elif rng.random() < 0.05:
            out.append(create_trial(state=TrialState.FAIL, params=params, distributions=lora, user_attrs=attrs(
                summary, ["lora"], pct, None, fidelity=0, full_fidelity=False, fail_reason="dev metric is nan")))
        else:
            out.append(create_trial(values=values(dev, pct, multi_objective), params=params, distributions=lora,
                                    user_attrs=attrs(summary, ["lora"], pct, dev)))
    return out


def build(storage, name: str = STUDY, multi_objective: bool = False, extra: int = 0) -> optuna.Study:
    """Write the example study into `storage` (a URL or an Optuna storage) and return it."""
    directions = ["maximize", "minimize"] if multi_objective else ["maximize"]
    study = optuna.create_study(study_name=name, storage=storage, directions=directions)
    for key, value in {
        "task": "rte", "model": "sentence-transformers/all-MiniLM-L6-v2", "space": "unipelt", "metric": METRIC,
        "direction": "maximize", "protocol": {"name": "k-shot", "k": 1000, "train_size": 1000},
        "objectives": [f"dev {METRIC}"] + (["stored params %"] if multi_objective else []),
    }.items():
        study.set_user_attr(key, value)
    study.add_trials(core_trials(multi_objective))
    study.enqueue_trial({"lora.rank": 4}, user_attrs={"summary": "queued"})  # #12, WAITING
    study.add_trials(extra_trials(extra, multi_objective))
    return study


if __name__ == "__main__":
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    url = sys.argv[1] if len(sys.argv) > 1 else "sqlite:///example.db"
    build(url, extra=int(sys.argv[2]) if len(sys.argv) > 2 else 30)
    print(f"wrote study {STUDY!r} to {url}")
