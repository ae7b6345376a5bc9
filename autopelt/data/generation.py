"""Text generation tasks: an input column -> a target column (E2E: meaning representation -> text).

Several rows may share one input (E2E has ~8 references per MR), so everything that splits or scores works on
inputs, not rows: a dev split is carved by input (no input on both sides), and test scores compare one generated
text per input with all of its references (corpus BLEU as sacrebleu computes it, ROUGE-L F as rouge-score does,
the best reference per input, averaged), as the E2E challenge scored them.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

from autopelt.data.files import find_split_file, read_rows
from autopelt.errors import UserError

PROMPT = "{input}\nText:"  # the fixed prompt: the target follows it after a space, ended by end-of-text


@dataclass(frozen=True)
class GenerationTask:
    name: str
    input_column: str
    target_column: str
    train_split: str = "train"
    test_split: str = "validation"  # as for GLUE: the labelled split beside train is the test set
    metric: str = "bleu"

    def prompt(self, row: dict) -> str:
        return PROMPT.format(input=row[self.input_column])


def generation_task_of(name: str, custom: dict | None) -> GenerationTask | None:
    """The generation task of your own input -> target columns (`custom` as settings.custom_task holds them);
    None for a classification or regression task."""
    if custom and custom.get("target_column"):
        return GenerationTask(name, custom["input_column"], custom["target_column"])
    return None


@dataclass(frozen=True)
class GenerationSplits:
    train: list[dict]
    dev: list[dict]
    test: list[dict]
    info: dict


def load_generation_splits(task: GenerationTask, data_dir) -> dict[str, list[dict]]:
    """`<data_dir>/<task>/{train,validation}.*`, each row checked for both columns (one line when one lacks)."""
    if not data_dir:
        raise UserError("a generation task reads your own data: pass --data-dir DIR holding DIR/NAME/train.jsonl")
    folder = Path(data_dir).expanduser() / task.name
    splits = {}
    for split in (task.train_split, task.test_split):
        path = find_split_file(folder, split)
        if path is None:
            raise UserError(f"no {split} file in {folder} (expected {split}.jsonl, .csv or .parquet)")
        rows = read_rows(path)
        for column in (task.input_column, task.target_column):
            missing = next((i for i, row in enumerate(rows) if not isinstance(row.get(column), str)), None)
            if missing is not None:
                known = ", ".join(sorted(rows[missing])) if rows else "none"
                raise UserError(f"{path}: row {missing + 1} has no text column {column!r} (its columns: {known})")
        splits[split] = rows
    return splits


def carve_by_input(rows: list[dict], column: str, dev_inputs: int, seed: int) -> tuple[list[dict], list[dict]]:
    """(train rows, dev rows): `dev_inputs` distinct inputs, drawn with `seed`, and all their rows go to dev."""
    inputs = sorted({row[column] for row in rows})
    if len(inputs) < 2:
        raise UserError(f"the train split has {len(inputs)} distinct {column!r}; a dev split needs at least two")
    dev_inputs = min(max(1, dev_inputs), len(inputs) - 1)
    chosen = set(random.Random(seed).sample(inputs, dev_inputs))
    return [r for r in rows if r[column] not in chosen], [r for r in rows if r[column] in chosen]


def make_generation_splits(loaded: dict[str, list[dict]], task: GenerationTask, k: int | None, seed: int,
                           dev_inputs: int | None = None) -> GenerationSplits:
    """Dev carved by input from train (10% of its inputs unless `dev_inputs`); then K train rows (all with None)."""
    train_rows = loaded[task.train_split]
    distinct = len({row[task.input_column] for row in train_rows})
    train, dev = carve_by_input(train_rows, task.input_column, dev_inputs or max(1, distinct // 10), seed)
    if k is not None and k < len(train):
        train = random.Random(seed + 1).sample(train, k)
    test = loaded[task.test_split]
    info = {"name": "full" if k is None else f"K={k}", "seed": seed, "train_size": len(train),
            "dev_size": len(dev), "dev_inputs": len({r[task.input_column] for r in dev}), "test_size": len(test),
            "test_inputs": len({r[task.input_column] for r in test})}
    return GenerationSplits(train, dev, test, info)


def references_by_input(rows: list[dict], task: GenerationTask) -> tuple[list[dict], list[list[str]]]:
    """One row per distinct input (its first), and each input's references, in first-seen order."""
    firsts, references = {}, {}
    for row in rows:
        key = row[task.input_column]
        firsts.setdefault(key, row)
        references.setdefault(key, []).append(row[task.target_column])
    return list(firsts.values()), list(references.values())


def corpus_scores(hypotheses: list[str], references: list[list[str]]) -> dict[str, float]:
    """Corpus BLEU (sacrebleu, 0-100) over all references of each input, and ROUGE-L F (rouge-score, 0-100): the best
    reference per input, averaged over inputs."""
    try:
        import sacrebleu
        from rouge_score import rouge_scorer
    except ImportError:
        raise UserError("scoring generated text needs sacrebleu and rouge-score: pip install 'autopelt[generation]'")
    widest = max(len(refs) for refs in references)
    streams = [[refs[i] if i < len(refs) else None for refs in references] for i in range(widest)]
    bleu = sacrebleu.corpus_bleu(hypotheses, streams).score
    scorer = rouge_scorer.RougeScorer(["rougeL"], use_stemmer=True)
    rouge = [scorer.score_multi(refs, hyp)["rougeL"].fmeasure for hyp, refs in zip(hypotheses, references)]
    return {"bleu": bleu, "rouge_l": 100.0 * sum(rouge) / max(1, len(rouge))}
