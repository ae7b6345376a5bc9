"""Generation tasks: dev carved by input, scores over all references of an input, batched greedy generation, and
`autopelt train`/`predict` on a tiny random decoder; bad input is one line and exit 2."""

from __future__ import annotations

import json

import pytest
from generationdata import e2e_like_rows, make_tiny_lm_folder, write_e2e_like
from tinymodels import tiny_model_dir  # noqa: F401  (fixture)

from autopelt import cli
from autopelt.errors import UserError
from autopelt.data.generation import GenerationTask, corpus_scores, make_generation_splits, references_by_input

pytest.importorskip("sacrebleu")
pytest.importorskip("rouge_score")
TASK = GenerationTask("e2e", "mr", "ref")


@pytest.fixture(scope="module")
def lm_dir(tmp_path_factory):
    return make_tiny_lm_folder(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return write_e2e_like(tmp_path_factory.mktemp("gen"))


def test_dev_is_carved_by_input_never_by_row():
    loaded = e2e_like_rows()
    for seed in range(5):
        splits = make_generation_splits(loaded, TASK, k=20, seed=seed, dev_inputs=4)
        train, dev = {r["mr"] for r in splits.train}, {r["mr"] for r in splits.dev}
        assert len(dev) == 4 and not train & dev
        assert len(splits.dev) == 12 and len(splits.train) == 20  # all 3 references of each dev input
        assert splits.info["test_inputs"] == 8


def test_scores_use_every_reference_of_an_input():
    rows = e2e_like_rows()["validation"]
    inputs, references = references_by_input(rows, TASK)
    assert len(inputs) == 8 and all(len(refs) == 2 for refs in references)
    perfect = corpus_scores([refs[1] for refs in references], references)  # any one reference is perfect
    assert perfect["bleu"] == pytest.approx(100.0) and perfect["rouge_l"] == pytest.approx(100.0)
    uneven = [refs[:1] if i % 2 else refs for i, refs in enumerate(references)]  # 1 or 2 references per input
    assert corpus_scores([refs[0] for refs in uneven], uneven)["bleu"] == pytest.approx(100.0)
    poor = corpus_scores(["the the the"] * len(references), references)
    assert poor["bleu"] < 5 and poor["rouge_l"] < 10


def test_batched_generation_equals_one_at_a_time(lm_dir):
    import torch

    from autopelt import delta
    from autopelt.models import load_language_model, load_tokenizer
    from autopelt.train.generate import generate

    model = delta.apply_delta(load_language_model(str(lm_dir)), {"methods": [{"method": "prefix", "length": 2}]})
    tokenizer = load_tokenizer(str(lm_dir))
    prompts = [TASK.prompt(r) for r in references_by_input(e2e_like_rows()["validation"], TASK)[0]]
    prompts[0] = "name [ Aromi ] Text :"  # rows of different lengths: left padding in the batch
    cpu = torch.device("cpu")
    together = generate(model, tokenizer, prompts, batch_size=8, max_new_tokens=6, device=cpu)
    alone = [generate(model, tokenizer, [p], batch_size=1, max_new_tokens=6, device=cpu)[0] for p in prompts]
    assert together == alone and any(together)


def train_args(lm_dir, data_dir, out, *more):
    return ["train", "--task", "e2e", "--input-column", "mr", "--target-column", "ref", "--model", str(lm_dir),
            "--data-dir", str(data_dir), "--out", str(out), "--epochs", "2", "--batch-size", "8", "--lr", "0.01",
            "--max-new-tokens", "8", "--threads", "1", *more]


def test_train_a_generation_delta_and_predict_with_it(lm_dir, data_dir, tmp_path, capsys):
    assert cli.main(train_args(lm_dir, data_dir, tmp_path / "out", "--method", "lora", "--rank", "4")) == 0
    result = json.loads((tmp_path / "out" / "result.json").read_text())
    assert result["status"] == "ok", result["reason"]
    assert set(result["test"]) == {"bleu", "rouge_l"} and result["metric"] == "bleu"
    assert result["dev_metric"] == -result["dev"]["loss"] and len(result["history"]) == 2
    assert result["protocol"]["test_inputs"] == 8 and result["protocol"]["dev_inputs"] == 1
    assert result["params"]["trainable"] == result["params"]["stored"] > 0
    first = result["history"][0]["dev"]["loss"]
    assert result["dev"]["loss"] <= first
    capsys.readouterr()
    delta_dir = tmp_path / "out" / "delta"
    assert cli.main(["predict", "--delta", str(delta_dir), "--text", "name[Aromi], food[French]",
                     "--max-new-tokens", "5"]) == 0
    printed = json.loads(capsys.readouterr().out.strip())
    assert printed["mr"] == "name[Aromi], food[French]" and isinstance(printed["text"], str)


def test_a_generation_trial_evaluates_every_n_steps_and_a_scheduler_can_stop_it(lm_dir, data_dir):
    from autopelt.train import TrialSettings, run_trial

    settings = TrialSettings(task="e2e", spec={"methods": [{"method": "lora", "rank": 4}]}, model=str(lm_dir),
                             data_dir=str(data_dir), custom_task={"input_column": "mr", "target_column": "ref"},
                             epochs=2, batch_size=8, eval_every=1, learning_rate=1e-2, threads=1, score_test=False)
    seen = []
    result = run_trial(settings, report=lambda entry: seen.append(entry) or len(seen) == 2)
    assert result["status"] == "ok", result["reason"]
    assert [e["step"] for e in result["history"]] == [1, 2] and result["stopped_by"] == "scheduler"
    assert seen == result["history"] and result["steps"] == 2


def test_exporting_a_generation_lora_writes_a_peft_folder_with_the_same_logits(lm_dir, data_dir, tmp_path):
    """A generation delta peft can hold is exported with its peft folder, built on the language model (no task
    head): PeftModel on the causal LM gives the logits of our merged delta."""
    import torch
    from peft import PeftModel
    from support.studies import study_of

    from autopelt.export.predict_generation import load_generation_model
    from autopelt.models import load_language_model, load_tokenizer

    assert cli.main(train_args(lm_dir, data_dir, tmp_path / "out", "--method", "lora", "--rank", "4")) == 0
    result = json.loads((tmp_path / "out" / "result.json").read_text())
    url = f"sqlite:///{tmp_path / 'study.db'}"
    study_of(url, "gen", result, tmp_path / "out")
    out = tmp_path / "export"
    assert cli.main(["export", "--study", "gen", "--storage", url, "--out", str(out)]) == 0
    assert json.loads((out / "metrics.json").read_text())["peft"] == "peft/"
    ours, _ = load_generation_model(out, str(lm_dir))
    theirs = PeftModel.from_pretrained(load_language_model(str(lm_dir)), str(out / "peft")).eval()
    batch = load_tokenizer(str(lm_dir))(["name [ Aromi ] Text :"], return_tensors="pt")
    with torch.no_grad():
        torch.testing.assert_close(theirs(**batch).logits, ours(**batch).logits, rtol=1e-4, atol=1e-5)


def test_gradient_checkpointing_trains_the_same_generation_delta_and_is_recorded(lm_dir, data_dir, tmp_path):
    """A generation trial checkpoints by default where its delta can take it (`--no-gradient-checkpointing` turns
    it off): the same training to the last digit that matters (dropout off), recorded in the result; a decoder
    prefix trains without it by default, and asked for it is one line, exit 2."""
    runs = {}
    for name, more in (("plain", ("--no-gradient-checkpointing",)), ("default", ()),
                       ("checkpointed", ("--gradient-checkpointing",))):
        assert cli.main(train_args(lm_dir, data_dir, tmp_path / name, "--method", "lora", "--rank", "4", *more)) == 0
        runs[name] = json.loads((tmp_path / name / "result.json").read_text())
    assert [runs[n]["settings"]["gradient_checkpointing"] for n in runs] == [False, None, True]
    assert [runs[n]["gradient_checkpointing"] for n in runs] == [False, True, True]
    losses = [[e["dev"]["loss"] for e in runs[n]["history"]] for n in runs]
    assert losses[0] == pytest.approx(losses[1], rel=1e-5) and losses[1] == losses[2]
    assert runs["plain"]["test"] == runs["default"]["test"]
    assert cli.main(train_args(lm_dir, data_dir, tmp_path / "prefix-default", "--method", "prefix", "--length",
                               "2")) == 0
    assert json.loads((tmp_path / "prefix-default" / "result.json").read_text())["gradient_checkpointing"] is False
    assert cli.main(train_args(lm_dir, data_dir, tmp_path / "prefix", "--method", "prefix", "--length", "2",
                               "--gradient-checkpointing")) == 2
    assert not (tmp_path / "prefix" / "delta").exists()


def test_the_target_tokens_alone_are_trained_on(lm_dir):
    from autopelt.models import load_tokenizer
    from autopelt.train.generate import IGNORE, encode

    tokenizer = load_tokenizer(str(lm_dir))
    row = {"mr": "name[Aromi], food[French]", "ref": "Aromi serves French food ."}
    example = encode(tokenizer, TASK, row, 64, seq2seq=False)
    prompt = tokenizer(TASK.prompt(row))["input_ids"]
    assert example["labels"][:len(prompt)] == [IGNORE] * len(prompt)
    target = example["labels"][len(prompt):]
    assert tokenizer.decode(target[:-1]) == row["ref"] and target[-1] == tokenizer.eos_token_id


@pytest.mark.parametrize("change, message", [
    (lambda a: a.__setitem__(a.index("ref"), "reference"), "has no text column 'reference'"),
    (lambda a: a.__setitem__(a.index("--input-column") + 1, "meaning"), "has no text column 'meaning'"),
    (lambda a: a.remove("--target-column") or a.remove("ref"), "--input-column and --target-column together"),
])
def test_bad_generation_input_is_one_line_exit_2_and_nothing_written(change, message, lm_dir, data_dir, tmp_path,
                                                                     capsys):
    args = train_args(lm_dir, data_dir, tmp_path / "out", "--method", "lora")
    change(args)
    assert cli.main(args) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1
    assert not (tmp_path / "out").exists()


def test_a_generation_task_on_an_encoder_classifier_is_refused(tiny_model_dir, data_dir, tmp_path, capsys):
    args = train_args(tiny_model_dir, data_dir, tmp_path / "out", "--method", "lora")
    assert cli.main(args) == 2
    err = capsys.readouterr().err.strip()
    assert "bert is an encoder with a classifier head" in err and len(err.splitlines()) == 1
    assert not (tmp_path / "out").exists()


def test_an_architecture_autopelt_cannot_read_is_one_line_exit_2(data_dir, tmp_path, capsys):
    from transformers import AutoModelForSeq2SeqLM, PegasusConfig

    folder = tmp_path / "pegasus"
    AutoModelForSeq2SeqLM.from_config(PegasusConfig(vocab_size=50, d_model=16, encoder_layers=1, decoder_layers=1,
                                                    encoder_attention_heads=2, decoder_attention_heads=2,
                                                    encoder_ffn_dim=32, decoder_ffn_dim=32)).save_pretrained(folder)
    args = train_args(folder, data_dir, tmp_path / "out", "--method", "lora")
    capsys.readouterr()  # what saving the model printed
    assert cli.main(args) == 2
    err = capsys.readouterr().err.strip()
    assert "model type 'pegasus' is an encoder-decoder autopelt does not know" in err and len(err.splitlines()) == 1
    assert not (tmp_path / "out").exists()


def search_args(lm_dir, data_dir, tmp_path, *more) -> list[str]:
    return ["search", "--task", "e2e", "--input-column", "mr", "--target-column", "ref", "--model", str(lm_dir),
            "--data-dir", str(data_dir), "--storage", f"sqlite:///{tmp_path / 'study.db'}",
            "--out", str(tmp_path / "study"), *more]


def test_a_search_on_a_generation_task_trains_language_model_deltas_and_scores_its_answer(lm_dir, data_dir,
                                                                                         tmp_path):
    """The controller with real trials, one at a time: baselines that apply to a Llama, a searched trial and a
    finalist, each counted as a language-model delta, selected by minus the dev loss; test (BLEU, ROUGE-L) scored
    for the baselines and the finalist as they train, and for the answer from its saved delta after the search."""
    from support import fakes

    from autopelt.study.answer_scores import score_answers
    from autopelt.search.controller import Controller
    from autopelt.search.plan import SearchOptions, prepare
    from autopelt.search.resume import open_study
    from autopelt.search.summary import summary_lines
    from autopelt.study import answers
    from autopelt.study.record import read_all
    from autopelt.train import run_trial

    plan = prepare(SearchOptions(
        task="e2e", custom_task={"input_column": "mr", "target_column": "ref"}, model=str(lm_dir),
        data_dir=str(data_dir), storage=f"sqlite:///{tmp_path / 'study.db'}", out=str(tmp_path / "out"), budget=5,
        epochs=1, cpus_per_trial=1))
    assert plan.generation and plan.portfolio is None and plan.metric == "bleu" and plan.dev_label == "-loss"
    assert plan.baselines == ["unipelt_apl", "lora"] and plan.finalists == 1
    study = open_study(plan)
    control = Controller(study, plan)
    control.start()
    results = {}

    def real(settings, report):
        results[settings.out_dir] = run_trial(settings.replace(threads=1), report)
        return results[settings.out_dir]

    assert fakes.run_serially(control, real) == 5
    records = [r for r in read_all(study) if r.result_dir]  # a draw too big for the tiny model is refused untrained
    assert len(records) == 5 and all(r.state.name in ("COMPLETE", "PRUNED") for r in records), \
        [r.fail_reason for r in records]
    for r in records:
        result = results[r.result_dir]
        assert result["metric"] == "bleu" and r.values[0] == pytest.approx(-result["dev"]["loss"])
        assert r.params_stored == result["params"]["stored"]  # counted as the language model's delta
        scored = bool(r.baseline or r.finalist_of)
        assert bool(result["test"]) == scored and (set(r.test) == {"bleu", "rouge_l"}) == scored
    assert not any(r.refines for r in records)  # refinements were chosen on classification
    best = answers.best(records)
    before = best.test
    assert score_answers(study) == ([] if before else [best.number])
    assert set(next(r for r in read_all(study) if r.number == best.number).test) == {"bleu", "rouge_l"}
    text = "\n".join(summary_lines(study, plan, 1.0))
    assert f"best: #{best.number} " in text and "dev -loss -" in text and "test " in text


def test_a_generation_search_takes_no_classification_portfolio_and_says_when_none_is_measured(tmp_path):
    from autopelt.portfolio.portfolio import SHIPPED, for_generation, for_search, load, to_file

    shipped = load(SHIPPED)
    to_file(list(shipped.members[:2]), "some-model", {}, tmp_path / "cls.json")
    with pytest.raises(UserError, match="learned on classification tasks; a generation task takes"):
        for_generation(str(tmp_path / "cls.json"), "some-model")
    to_file(list(shipped.members[:2]), "some-model", {}, tmp_path / "gen.json", extra={"task_kind": "generation"})
    with pytest.raises(UserError, match="learned on generation tasks; this search classifies"):
        for_search(str(tmp_path / "gen.json"), "some-model", "default")
    assert for_generation(str(tmp_path / "gen.json"), "some-model")[0].task_kind == "generation"
    assert for_generation("auto", "some-model") == (
        None, "no portfolio: none has been measured for generation on some-model (the shipped one was learned on "
              "classification)")


@pytest.mark.parametrize("more, message", [
    (("--portfolio", "some.json"), "no such file"),
    (("--target-column", "nope"), "has no text column 'nope'"),
])
def test_bad_generation_search_input_is_one_line_exit_2_and_no_study(more, message, lm_dir, data_dir, tmp_path,
                                                                     capsys):
    assert cli.main(search_args(lm_dir, data_dir, tmp_path, "--budget", "2", *more)) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1
    assert not (tmp_path / "study").exists() and not (tmp_path / "study.db").exists()


def test_a_generation_search_on_an_encoder_classifier_is_refused(tiny_model_dir, data_dir, tmp_path, capsys):
    assert cli.main(search_args(tiny_model_dir, data_dir, tmp_path, "--budget", "2")) == 2
    err = capsys.readouterr().err.strip()
    assert "needs a model that generates" in err and len(err.splitlines()) == 1
    assert not (tmp_path / "study.db").exists()


@pytest.mark.slow
def test_autopelt_search_on_a_generation_task_end_to_end_then_export(lm_dir, data_dir, tmp_path, capsys):
    """The command as a user runs it (Ray, one worker), then the export of its answer with its test scores."""
    assert cli.main(search_args(lm_dir, data_dir, tmp_path, "--budget", "4", "--epochs", "1")) == 0
    out = capsys.readouterr().out
    assert "dev -loss" in out and "sweep of dev loss" in out and "best: #" in out
    name = next(line.split()[1] for line in out.splitlines() if line.startswith("study "))
    assert cli.main(["export", "--study", name, "--storage", f"sqlite:///{tmp_path / 'study.db'}",
                     "--out", str(tmp_path / "export")]) == 0
    metrics = json.loads((tmp_path / "export" / "metrics.json").read_text())
    assert set(metrics["test"]) == {"bleu", "rouge_l"} and metrics["metric"] == "bleu"


@pytest.mark.parametrize("family, method", [("gpt2", ("--method", "prefix", "--length", "2")),
                                            ("t5", ("--method", "ia3")), ("t5", ("--method", "prompt", "--length", "2")),
                                            ("t5-gated", ("--preset", "unipelt_apl")),
                                            ("llama", ("--preset", "unipelt_apl"))])
def test_each_family_trains_a_generation_delta(family, method, data_dir, tmp_path):
    folder = make_tiny_lm_folder(tmp_path / family, family)
    assert cli.main(train_args(folder, data_dir, tmp_path / "out", *method)) == 0
    result = json.loads((tmp_path / "out" / "result.json").read_text())
    assert result["status"] == "ok" and set(result["test"]) == {"bleu", "rouge_l"}
