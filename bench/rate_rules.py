"""Which rule should set the portfolio's rates on a model other than the one they were measured on?

For a model and a task, the search's first portfolio members (as the search chooses them: the shipped portfolio,
its prior over the task's meta-features, the members the model's family takes) are each trained at a ladder of
rates around what every rule gives, x1/3, x1 and x3:

- `absolute`: the rate recorded with the member, measured on all-MiniLM-L6-v2 (today's default);
- `calibrated`: that rate times this model's LoRA rate (LoRA's sweep on this model and task, run first) over
  LoRA's rate on the tasks the member was learned from (`--rates calibrated`);
- `transfer`: that rate times (384 / H)^0.781, H the model's hidden size (Thinking Machines' cookbook,
  `tinker_cookbook/hyperparam_utils.py`: the rate falls as a power of the hidden size; 384 is MiniLM's).

The summary says, per member, which rule's x1 rate lands nearest the best rate of the ladder (by mean dev over
the seeds: dev selects) and the test metric each rule's x1 rate gives (test reports). Every trial is one row of
`<work>/trials.jsonl`, written as it ends, so a killed run resumes where it stopped.

    python bench/rate_rules.py run --model mpnet-base --task sst2 --k 500 --data-dir ../shared/data/glue --seeds 0 1
    python bench/rate_rules.py summary       # writes benchmarks/results/rate-rules-*
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results import write_results  # noqa: E402

REFERENCE_HIDDEN = 384  # all-MiniLM-L6-v2's hidden size: where the portfolio's rates were measured
TRANSFER_POWER = 0.781  # the cookbook's exponent for Llama models (hyperparam_utils.get_lr)
LADDER = (1 / 3, 1.0, 3.0)
RULES = ("absolute", "calibrated", "transfer")
DEFAULT_WORK = Path(__file__).resolve().parents[1] / "benchmarks" / "runs" / "rate-rules"  # committed: a later
# session resumes where this one stopped


def rule_rates(recorded: float, hidden: int, lora_rate: float | None, reference: float | None) -> dict[str, float]:
    """Each rule's rate for a member recorded at `recorded` on MiniLM, on a model of hidden size `hidden`."""
    rates = {"absolute": recorded, "transfer": recorded * (REFERENCE_HIDDEN / hidden) ** TRANSFER_POWER}
    if lora_rate and reference:
        rates["calibrated"] = recorded * lora_rate / reference
    return rates


def ladder(rates: dict[str, float]) -> list[float]:
    """Every rate the rules' ladders hold, those within 5% of one already taken dropped (rounded to 3 digits)."""
    taken: list[float] = []
    for rate in sorted(r * step for r in rates.values() for step in LADDER):
        if all(abs(math.log(rate / t)) > math.log(1.05) for t in taken):
            taken.append(float(f"{rate:.3g}"))
    return taken


def members_for(model: str, task_name: str, k: int, data_dir: str | None, count: int):
    """The first `count` members a search on this model and task runs (read as the search reads them:
    autopelt/search/plan.py), the portfolio, and the model's config."""
    from autopelt.data.check import load_and_check
    from autopelt.data.tasks import get_task
    from autopelt.models import load_config, model_name, resolve_model
    from autopelt.portfolio.portfolio import for_search
    from autopelt.search.plan import _task_features
    from autopelt.search.space_models import portfolio_for_model

    resolved = resolve_model(model)
    task = get_task(task_name)
    config = load_config(resolved, task.num_labels)
    _, loaded = load_and_check(task, data_dir, k, seed=0)
    features = _task_features(task, loaded.get(task.train_split), resolved, k)
    portfolio, _ = for_search("auto", model_name(resolved), "default", features, "absolute")
    portfolio, _ = portfolio_for_model(portfolio, config)
    return portfolio.members[:count], portfolio, config


def run_one(settings: dict) -> dict:
    from autopelt.train import TrialSettings, run_trial

    started = time.monotonic()
    result = run_trial(TrialSettings.from_dict(settings))
    metric = result.get("metric") or next(iter(result.get("dev") or {"accuracy": None}))
    return {"status": result["status"], "metric": metric, "precision": result.get("precision"),
            "learning_rate": result.get("learning_rate"),
            "dev": (result.get("dev") or {}).get(metric), "test": (result.get("test") or {}).get(metric),
            "seconds": round(time.monotonic() - started, 1), "reason": result.get("reason")}


def done_rows(path: Path) -> dict[str, dict]:
    if not path.is_file():
        return {}
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return {row["key"]: row for row in rows}


def append(path: Path, row: dict) -> None:
    with path.open("a") as out:
        out.write(json.dumps(row) + "\n")


def run(args) -> None:
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    log = work / "trials.jsonl"
    done = done_rows(log)
    members, portfolio, config = members_for(args.model, args.task, args.k, args.data_dir, args.members)
    if args.only is not None and not set(args.only) <= set(range(len(members))):
        raise SystemExit(f"--only takes member indexes from 0 to {len(members) - 1}, not {args.only}")
    common = dict(task=args.task, model=args.model, data_dir=args.data_dir, protocol=args.k, epochs=args.epochs,
                  threads=args.threads, max_train_examples=args.max_train_examples, precision=args.precision)
    where = f"{args.model}|{args.task}|k{args.k}"
    for seed in args.seeds:
        key = f"{where}|lora-sweep|seed{seed}"
        if key not in done:
            lora = run_one({**common, "spec": {"methods": [{"method": "lora"}]}, "seed": seed, "data_seed": 0})
            done[key] = {"key": key, "model": args.model, "task": args.task, "member": "lora-sweep", "seed": seed,
                         **lora}
            append(log, done[key])
            print(f"{key}: lora swept to {lora['learning_rate']} (dev {lora['dev']})", flush=True)
    swept = [done[f"{where}|lora-sweep|seed{s}"]["learning_rate"] for s in args.seeds]
    lora_rate = math.exp(sum(map(math.log, swept)) / len(swept)) if all(swept) else None
    for index, member, rates, rate in _rungs(members, portfolio, config, lora_rate, _best_so_far(done, where)):
        if args.only is not None and index not in args.only:
            continue
        hparams = portfolio.hparams(index, args.epochs)
        for seed in args.seeds:
            key = f"{where}|{member.name}|{rate:g}|seed{seed}"
            if key in done:
                continue
            settings = {**common, "spec": member.spec(_num_layers(config)), "seed": seed, "data_seed": 0,
                        **{**hparams, "learning_rate": rate}}
            row = {"key": key, "model": args.model, "task": args.task, "member": member.name, "rank": index,
                   "recorded": member.learning_rate, "rate": rate, "seed": seed, "rules": rates,
                   **run_one(settings)}
            append(log, row)
            print(f"{key}: dev {row['dev']} test {row['test']} ({row['seconds']}s)", flush=True)


def _rungs(members, portfolio, config, lora_rate: float | None, best: dict[str, float] | None = None):
    """(index, member, its rules' rates, a rung's rate) for every rung, each rule's own x1 rate first for every
    member (so a run cut short has each rule's answer before the ladders around them), then the other rungs, those
    nearest (in log rate) their member's best rate by dev so far (`best`: member name -> rate) first: a run cut
    short has the rungs that can still move the best."""
    first, rest = [], []
    for index, member in enumerate(members):
        rates = rule_rates(member.learning_rate, config.hidden_size, lora_rate, portfolio.reference_rate)
        for rate in ladder(rates):
            own = any(abs(math.log(rate / r)) <= math.log(1.05) for r in rates.values())
            (first if own else rest).append((index, member, rates, rate))
    best = best or {}
    rest.sort(key=lambda rung: abs(math.log(rung[3] / best.get(rung[1].name, rung[3]))))  # stable: ties by rate
    return first + rest


def _best_so_far(done: dict[str, dict], where: str) -> dict[str, float]:
    """Member name -> the rate of its best dev so far among the rows of `where` (model|task|K), over seeds."""
    runs: dict[str, dict[float, list[float]]] = {}
    for key, row in done.items():
        if key.startswith(where + "|") and row["member"] != "lora-sweep" and row.get("dev") is not None:
            runs.setdefault(row["member"], {}).setdefault(row["rate"], []).append(row["dev"])
    return {member: max(rates, key=lambda r: sum(rates[r]) / len(rates[r])) for member, rates in runs.items()}


def _num_layers(config) -> int:
    from autopelt.delta.families import architecture_of

    return architecture_of(config).num_layers(config)


def summarise(rows: list[dict]) -> list[dict]:
    """Per (model, task, member): the ladder's best rate by mean dev (over the rungs run so far: `rungs`), and per
    rule its x1 rate, how far that is from the best (|log10| of the ratio) and its mean test (None until it has
    run)."""
    table = []
    groups: dict[tuple, list[dict]] = {}
    for row in rows:
        if row["member"] != "lora-sweep" and row["status"] == "ok":
            groups.setdefault((row["model"], row["task"], row["member"]), []).append(row)
    for (model, task, member), trials in sorted(groups.items()):
        by_rate: dict[float, list[dict]] = {}
        for trial in trials:
            by_rate.setdefault(trial["rate"], []).append(trial)
        mean = lambda values: sum(values) / len(values)  # noqa: E731
        dev = {rate: mean([t["dev"] for t in runs]) for rate, runs in by_rate.items()}
        best = max(dev, key=dev.get)
        rules = trials[0]["rules"]
        entry = {"model": model, "task": task, "member": member, "best_rate": best, "best_dev": round(dev[best], 4),
                 "seeds": len(by_rate[best]), "rungs": f"{len(by_rate)} of {len(ladder(trials[0]['rules']))}"}
        for rule in RULES:
            if rule not in rules:
                continue
            nearest = min(by_rate, key=lambda r: abs(math.log(r / rules[rule])))
            entry[f"{rule}_rate"] = float(f"{rules[rule]:.3g}")
            entry[f"{rule}_off"] = round(abs(math.log10(rules[rule] / best)), 2)
            ran = abs(math.log(nearest / rules[rule])) <= math.log(1.05)  # the rule's own rate has run
            entry[f"{rule}_test"] = round(mean([t["test"] for t in by_rate[nearest]]), 4) if ran else None
        table.append(entry)
    return table + _means(table)


def _means(table: list[dict]) -> list[dict]:
    """Per (model, task) with 2+ members, and per model over its tasks where it has 2+ (task "all"): a "mean" row,
    each rule's distance and test averaged over the member cells where its test has run (`members` says how many).
    Over 2+ models, one more (model and task "all") over the cells `decide` reads: those where every rule ran."""
    groups = {(e["model"], e["task"]): [x for x in table if (x["model"], x["task"]) == (e["model"], e["task"])]
              for e in table}
    for model in dict.fromkeys(e["model"] for e in table):
        if len({e["task"] for e in table if e["model"] == model}) > 1:
            groups[(model, "all")] = [e for e in table if e["model"] == model]
    if len({e["model"] for e in table}) > 1:
        groups[("all", "all")] = _deciding(table)
    rows = []
    for (model, task), members in groups.items():
        if len(members) < 2:
            continue
        row = {"model": model, "task": task, "member": "mean"}
        for rule in RULES:
            ran = [e for e in members if e.get(f"{rule}_test") is not None]
            if ran:
                row[f"{rule}_off"] = round(sum(e[f"{rule}_off"] for e in ran) / len(ran), 2)
                row[f"{rule}_test"] = round(sum(e[f"{rule}_test"] for e in ran) / len(ran), 4)
                row[f"{rule}_members"] = len(ran)
        rows.append(row)
    return rows


DECIDES_BY = 0.1  # decades: set before the second task ran (see decide)


def decide(table: list[dict]) -> str:
    """The rule a search should use on a model other than the portfolio's, by the rule written down before the
    second task ran: over every member cell (model, task, member) where all three rules' rates have run, the rule
    whose x1 rate lies nearest the ladder's best rate by dev (mean |log10| distance), where it is nearer than
    `absolute` by at least DECIDES_BY decades; else `absolute` (today's default) stays. Test only reports."""
    cells = _deciding(table)
    if not cells:
        return "absolute"
    off = {rule: sum(e[f"{rule}_off"] for e in cells) / len(cells) for rule in RULES}
    nearest = min(off, key=off.get)
    return nearest if off["absolute"] - off[nearest] >= DECIDES_BY - 1e-9 else "absolute"


def _deciding(table: list[dict]) -> list[dict]:
    """The member cells (no mean rows) where every rule's own rate has run."""
    return [e for e in table if e["member"] != "mean" and all(e.get(f"{r}_test") is not None for r in RULES)]


def summary(args) -> None:
    rows = list(done_rows(Path(args.work) / "trials.jsonl").values())
    table = summarise(rows)
    for entry in table:
        print(json.dumps(entry))
    print(f"the rule written down before the second task ran chooses: {decide(table)}")
    if table:
        precisions = sorted({row.get("precision") or "not recorded" for row in rows})  # recorded since 2026-12-03:
        #                   a ladder's rungs run on different machines may have computed in different precisions
        settings = {"ladder": LADDER, "transfer_power": TRANSFER_POWER, "reference_hidden": REFERENCE_HIDDEN,
                    "decides_by": DECIDES_BY, "chooses": decide(table)}
        path = write_results("rate-rules", table, precision=" + ".join(precisions), settings=settings,
                             notes="dev picks the best rate of each member's ladder; test is each rule's x1 rate's "
                                   "mean over seeds; the machine above wrote the summary: the rungs ran on the "
                                   "machines of the sessions that ran them (benchmarks/runs/rate-rules)")
        print(f"wrote {path}")


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    go = commands.add_parser("run", help="train the ladders (resumes)")
    go.add_argument("--model", required=True)
    go.add_argument("--task", required=True)
    go.add_argument("--k", type=int, default=500)
    go.add_argument("--data-dir")
    go.add_argument("--seeds", type=int, nargs="+", default=[0])
    go.add_argument("--members", type=int, default=3)
    go.add_argument("--only", type=int, nargs="+", metavar="INDEX",
                    help="only these of the members (0 is the first): two runs at once, each on its own members")
    go.add_argument("--epochs", type=int, default=3)
    go.add_argument("--threads", type=int)
    go.add_argument("--precision", default="auto", help="the trials' precision (default auto); pin it where a "
                    "ladder's rungs run on machines whose `auto` differs")
    go.add_argument("--max-train-examples", type=int, help="a quick check only: fewer train rows")
    go.add_argument("--work", default=str(DEFAULT_WORK))
    show = commands.add_parser("summary", help="the table, written to benchmarks/results/")
    show.add_argument("--work", default=str(DEFAULT_WORK))
    return parser.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    run(args) if args.command == "run" else summary(args)


if __name__ == "__main__":
    main()
