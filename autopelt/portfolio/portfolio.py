"""A portfolio file: the ordered configurations a search runs first, with what they were learned from.

    {"format": "autopelt-portfolio", "version": 1, "model": "all-MiniLM-L6-v2", "space": "default",
     "design_version": 1, "built_from": {...}, "members": [{"name", "methods", "learning_rate", "batch_size",
     "pooling", "layers", "backbone_dropout"}, ...], "baseline_rates": {"unipelt_apl": 0.001},
     "calibration": {"baseline": "lora", "rates": {"sst2": 0.003, ...}}}

A member's learning rate was measured on the portfolio's model. `calibration` (optional) holds the rate LoRA's
learning-rate sweep chose on each task the portfolio learned from, on that model: the calibration a study measures
again on its own model and task (its LoRA baseline's sweep), so that a member trains at its recorded rate times
the study's LoRA rate over the reference (the geometric mean of `calibration` over the tasks its members were chosen
from): its rate *relative* to LoRA's, which may carry to another model where the absolute one does not. Whether a
study calibrates is `Portfolio.calibrate` (`for_search`: `--rates calibrated`). `layers` "upper_half" is resolved
per model, like the design's. `baseline_rates` (optional) is the rate learned with the portfolio for a baseline of
a study that runs it. Which rate a member or a baseline trains at is decided in `autopelt.search.rate_policy`.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, replace
from pathlib import Path

from autopelt.errors import UserError
from autopelt.portfolio.config import Config
from autopelt.portfolio.metafeatures import MetaFeatures
from autopelt.portfolio.prior import Prior

FORMAT, VERSION = "autopelt-portfolio", 1
TASK_KINDS = ("classification", "generation")
SPACE = "default"  # the search space whose studies a portfolio opens
SIZE = 16
SHIPPED = Path(__file__).parent / "data" / "portfolio-all-MiniLM-L6-v2.json"
RATES = ("absolute", "calibrated", "transfer")  # --rates; docs/learning-rates.md says why absolute is the default
# --rates transfer: a rate measured on a model of hidden size H0 is used on one of hidden size H as rate x (H0/H)^P
# (Thinking Machines' cookbook, tinker_cookbook/hyperparam_utils.py: P = 0.781 for Llama models); H0 per portfolio model
TRANSFER_POWER = 0.781
HIDDEN_SIZES = {"all-MiniLM-L6-v2": 384}
CALIBRATION_BASELINE = "lora"  # the baseline whose sweep measures a study's calibration


@dataclass(frozen=True)
class Portfolio:
    model: str
    members: tuple[Config, ...]
    source: str  # the file it was read from
    built_from: dict
    baseline_rates: dict[str, float] = field(default_factory=dict)  # preset name -> learned rate
    prior: Prior | None = None  # the task-aware prior (prior.py): members chosen for the task at hand
    calibration: dict[str, float] = field(default_factory=dict)  # task -> LoRA's swept rate on the portfolio's model
    reference_tasks: tuple[str, ...] = ()  # the tasks its members were chosen from (the prior's nearest); () all
    calibrate: bool = False  # a study trains members at rates relative to its own LoRA rate (for_search decides)
    transfer: float = 1.0  # or at their rates times this, (H0 / H)^TRANSFER_POWER (for_search decides)
    task_kind: str = "classification"  # or "generation": the tasks it was learned on, the searches it opens

    @property
    def reference_rate(self) -> float | None:
        """LoRA's rate on the tasks the members were chosen from, on the portfolio's model: the geometric mean of
        `calibration` over them (over every task it holds where it holds none of them); None without one."""
        rates = [self.calibration[t] for t in self.reference_tasks if t in self.calibration] \
            or list(self.calibration.values())
        return math.exp(sum(map(math.log, rates)) / len(rates)) if rates else None

    def for_task(self, features: MetaFeatures | None) -> tuple[Portfolio, str]:
        """This portfolio with its members chosen for a task of `features` by its prior, and one line saying from
        which tasks; itself, with an empty line, without a prior or features."""
        if self.prior is None or features is None:
            return self, ""
        members, nearest, like = self.prior.portfolio(features, len(self.members))
        names = ", ".join(name for name, _ in nearest[:8]) + (", ..." if len(nearest) > 8 else "")
        if like:
            line = (f"a task like {names} ({features.describe()}): its portfolio is learned from those "
                    f"{len(nearest)} of {len(self.prior.tasks)} tasks")
        else:
            line = (f"this task ({features.describe()}) is unlike all {len(self.prior.tasks)} tasks of the prior "
                    f"(nearest {nearest[0][0]} at {nearest[0][1]:.1f}, past {self.prior.unlike:.1f}): the portfolio "
                    "learned from every task answers")
        return replace(self, members=tuple(members), reference_tasks=tuple(name for name, _ in nearest)), line

    def hparams(self, index: int, epochs: int) -> dict:
        member = self.members[index]
        return {"learning_rate": member.learning_rate, "batch_size": member.batch_size,
                "backbone_dropout": member.backbone_dropout, "epochs": epochs,
                **({"head_lr_scale": member.head_lr_scale} if member.head_lr_scale != 1 else {})}


def to_file(members: list[Config], model: str, built_from: dict, out: str | Path,
            baseline_rates: dict[str, float] | None = None, design_version: int | None = None,
            extra: dict | None = None, calibration: dict[str, float] | None = None) -> dict:
    """Write a portfolio file (atomically); `design_version`: the meta-dataset design its members are named in
    (None for members learned from a user's studies); `extra`: more top-level fields (the task-aware prior);
    `calibration`: task -> LoRA's swept rate there, on `model`."""
    from autopelt.files import write_atomic

    data = {"format": FORMAT, "version": VERSION, "model": model, "space": SPACE, "design_version": design_version,
            "built_from": built_from, "members": [m.to_dict() for m in members],
            **({"baseline_rates": baseline_rates} if baseline_rates else {}),
            **({"calibration": {"baseline": CALIBRATION_BASELINE, "rates": calibration}} if calibration else {}),
            **(extra or {})}
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    write_atomic(Path(out), json.dumps(data, indent=1))
    return data


def load(path: str | Path, model: str | None = None) -> Portfolio:
    """Read and check a portfolio file; `model` (a model's recorded name) must be the one it was learned on."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise UserError(f"--portfolio {path}: no such file; build one with `autopelt portfolio build`") from None
    except (OSError, ValueError) as error:
        raise UserError(f"--portfolio {path} is not a readable portfolio file ({error})") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise UserError(f"--portfolio {path} is not an autopelt portfolio (no \"format\": \"{FORMAT}\")")
    if data.get("version") != VERSION:
        raise UserError(f"--portfolio {path} has format version {data.get('version')!r}; this autopelt reads "
                        f"version {VERSION}: build it again with `autopelt portfolio build`")
    if data.get("space") != SPACE:
        raise UserError(f"--portfolio {path} was built for the {data.get('space')!r} space, not {SPACE!r}")
    if model is not None and data.get("model") != model:
        raise UserError(f"--portfolio {path} was learned on model {data.get('model')!r}, not {model!r}: build one "
                        "from your own studies (`autopelt portfolio build --storage URL`) or pass --portfolio none")
    try:
        members = tuple(_member(m) for m in data["members"])
    except (KeyError, TypeError, ValueError) as error:
        raise UserError(f"--portfolio {path}: a member is malformed ({error!r})") from None
    if not members:
        raise UserError(f"--portfolio {path} has no members")
    task_kind = data.get("task_kind", "classification")
    if task_kind not in TASK_KINDS:
        raise UserError(f"--portfolio {path}: task_kind must be one of {', '.join(TASK_KINDS)}, not {task_kind!r}")
    try:
        prior = Prior.from_dict(data["prior"], _member) if data.get("prior") else None
    except (KeyError, TypeError, ValueError) as error:
        raise UserError(f"--portfolio {path}: its prior is malformed ({error!r})") from None
    return Portfolio(data["model"], members, str(path), data.get("built_from") or {},
                     _baseline_rates(path, data.get("baseline_rates") or {}), prior,
                     _calibration(path, data.get("calibration")), task_kind=task_kind)


def _calibration(path: Path, entry) -> dict[str, float]:
    if entry is None:
        return {}
    rates = entry.get("rates") if isinstance(entry, dict) else None
    if not isinstance(entry, dict) or entry.get("baseline") != CALIBRATION_BASELINE or not isinstance(rates, dict) \
            or not all(isinstance(r, (int, float)) and not isinstance(r, bool) and r > 0 for r in rates.values()):
        raise UserError(f"--portfolio {path}: calibration must be {{\"baseline\": \"{CALIBRATION_BASELINE}\", "
                        "\"rates\": {task: positive learning rate}}")
    return {str(task): float(rate) for task, rate in rates.items()}


def _baseline_rates(path: Path, rates) -> dict[str, float]:
    from autopelt.delta.presets import PRESETS

    if not isinstance(rates, dict):
        raise UserError(f"--portfolio {path}: baseline_rates must map a baseline to its learning rate")
    for name, rate in rates.items():
        if name not in PRESETS or isinstance(rate, bool) or not isinstance(rate, (int, float)) or not rate > 0:
            raise UserError(f"--portfolio {path}: baseline_rates {name!r}: {rate!r} is not a known baseline with a "
                            "positive learning rate")
    return {name: float(rate) for name, rate in rates.items()}


def _member(entry: dict) -> Config:
    from autopelt.delta import parse_spec

    config = Config(name=str(entry["name"]), methods=tuple(entry["methods"]),
                    learning_rate=float(entry["learning_rate"]), batch_size=int(entry["batch_size"]),
                    pooling=str(entry.get("pooling", "mean")), layers=entry.get("layers"),
                    backbone_dropout=str(entry.get("backbone_dropout", "model")),
                    head_lr_scale=float(entry.get("head_lr_scale", 1.0)))
    if not config.learning_rate > 0 or config.batch_size < 1:
        raise ValueError(f"{config.name}: learning rate and batch size must be positive")
    try:
        parse_spec(config.spec(12))
    except UserError as error:
        raise ValueError(f"{config.name}: {error}") from None
    return config


def for_search(choice: str, model_name: str, space_name: str, features: MetaFeatures | None = None,
               rates: str = "absolute", hidden_size: int | None = None) -> tuple[Portfolio | None, str]:
    """The portfolio a search runs first, and the line(s) saying which and why.

    Args:
        choice: "auto" (the shipped one, for the default space), "none", or a portfolio file (checked against the
            model).
        model_name: the model's recorded name.
        space_name: the search space's name.
        features: the task's meta-features; with a portfolio that carries a prior, its members are chosen for them.
        rates: how its members' rates are read (RATES): "absolute" as recorded (the default), "calibrated"
            relative to the LoRA rate the study sweeps on its own model and task, "transfer" scaled by a power of
            the hidden sizes (TRANSFER_POWER).
        hidden_size: the study's model's hidden size (what "transfer" scales by).

    Returns:
        (the portfolio or None, a line for the console; a second line names the tasks the prior judged similar).

    Raises:
        UserError: a portfolio file that is missing, malformed or learned on another model; `rates` calibrated for a
            portfolio without a calibration.
    """
    if rates not in RATES:
        raise UserError(f"--rates must be one of {', '.join(RATES)}, not {rates!r}")
    if choice == "none":
        return None, "no portfolio (--portfolio none)"
    if choice != "auto":
        portfolio, similar = load(choice, model_name).for_task(features)
        if portfolio.task_kind != "classification":
            raise UserError(f"--portfolio {choice} was learned on {portfolio.task_kind} tasks; this search "
                            "classifies: pass a portfolio learned on classification, or --portfolio none")
        line = f"portfolio {choice} ({len(portfolio.members)} configurations learned on {portfolio.model})"
    elif space_name != SPACE:
        return None, (f"no portfolio: the shipped one opens the {SPACE!r} space, and this search draws from "
                      f"{space_name!r}")
    else:
        portfolio, similar = load(SHIPPED).for_task(features)
        learned = portfolio.built_from.get("tasks", [])
        source = "the tasks most like this one (below)" if similar else f"{len(learned)} tasks"
        line = (f"portfolio: {len(portfolio.members)} configurations learned on {portfolio.model} from {source}, "
                "run first")
    portfolio, rates_line = _rates(portfolio, model_name, rates, hidden_size)
    if portfolio.baseline_rates:
        line += "; " + ", ".join(f"{name} at its learned rate {rate:g}"
                                 for name, rate in portfolio.baseline_rates.items())
    return portfolio, line + (f"\n{rates_line}" if rates_line else "") + (f"\nprior: {similar}" if similar else "")


def generation_shipped(model_name: str) -> Path:
    """Where the portfolio a generation search on `model_name` starts from ships (none may be there yet)."""
    return SHIPPED.with_name(f"portfolio-generation-{model_name.replace('/', '--')}.json")  # a hub id's "/"


def for_generation(choice: str, model_name: str) -> tuple[Portfolio | None, str]:
    """The portfolio a generation search runs first, and the line saying which: "auto" the one shipped for the
    model, where one was measured (`generation_shipped`); a file of kind "generation" learned on the model; "none".

    Raises:
        UserError: a file that is missing, malformed, learned on another model or on classification tasks.
    """
    if choice == "none":
        return None, "no portfolio (--portfolio none)"
    path = generation_shipped(model_name) if choice in ("auto", "", None) else Path(choice)
    if choice in ("auto", "", None) and not path.is_file():
        return None, (f"no portfolio: none has been measured for generation on {model_name} (the shipped one was "
                      "learned on classification)")
    portfolio = load(path, model_name)
    if portfolio.task_kind != "generation":
        raise UserError(f"--portfolio {choice} was learned on {portfolio.task_kind} tasks; a generation task takes "
                        "a generation portfolio, or --portfolio none")
    tasks = ", ".join(portfolio.built_from.get("tasks", [])) or "its tasks"
    return portfolio, (f"portfolio: {len(portfolio.members)} configurations measured on {portfolio.model} for "
                       f"generation ({tasks}), run first")


def _rates(portfolio: Portfolio, model_name: str, rates: str, hidden_size: int | None = None) -> tuple[Portfolio, str]:
    """The portfolio set to calibrate, to transfer, or neither (`rates`, see for_search), and the line that says which
    rates it trains at ("" on its own model at its recorded rates: the portfolio's line names the model they came
    from)."""
    if rates == "calibrated" and not portfolio.calibration:
        raise UserError(f"--rates calibrated: portfolio {portfolio.source} records no LoRA rates to calibrate "
                        "against (built before calibration, or from studies without a LoRA baseline); pass --rates "
                        "absolute")
    if rates == "calibrated":
        return replace(portfolio, calibrate=True), (
            f"rates: calibrated: members train at their rate on {portfolio.model} times this study's LoRA rate "
            f"(its baseline's sweep, run first) over {portfolio.reference_rate:.2g}, LoRA's rate on the tasks they "
            "were learned from")
    if rates == "transfer":
        return _transferred(portfolio, hidden_size)
    if model_name != portfolio.model:
        return portfolio, (f"rates: as measured on {portfolio.model}, not on {model_name} (the default: on "
                           "MPNet-base and SmolLM2-135M, SST-2 and MRPC, neither transfer's nor calibrated rates lay "
                           "nearer each member's best by 0.1 decade; docs/learning-rates.md)"
                           + ("; --rates calibrated or transfer fit them to this model" if portfolio.calibration
                              else "; --rates transfer fits them to this model"))
    return portfolio, ""  # on its own model: the first line says where its rates were measured


def _transferred(portfolio: Portfolio, hidden_size: int | None) -> tuple[Portfolio, str]:
    """The portfolio set to train every member's and learned baseline's rate times (H0 / H)^TRANSFER_POWER, H0 the
    portfolio model's hidden size (search/rate_policy.py applies it)."""
    reference = HIDDEN_SIZES.get(portfolio.model)
    if reference is None or not hidden_size:
        raise UserError(f"--rates transfer needs the hidden size of the portfolio's model ({portfolio.model}) and of "
                        "this one; pass --rates absolute or calibrated")
    scale = (reference / hidden_size) ** TRANSFER_POWER
    return replace(portfolio, transfer=scale), (
        f"rates: transfer: members and learned baseline rates train at their rate on {portfolio.model} times "
        f"({reference}/{hidden_size})^"
        f"{TRANSFER_POWER} = {scale:.2f} (the hidden-size rule of Thinking Machines' cookbook)")
