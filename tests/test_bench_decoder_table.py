"""bench/decoder_table.py: dev picks each arm's rate (never test), and a failed trial is a row, not a lost table."""

from __future__ import annotations

from support import benches


def load_bench():
    return benches.load_bench("decoder_table")


def trial(arm, rate, dev_loss, bleu):
    return {"arm": arm, "rate": rate, "seed": 0, "status": "ok", "dev_metric": -dev_loss, "params_pct": 0.3,
            "test": {"bleu": bleu, "rouge_l": bleu}, "total_seconds": 10.0, "peak_memory_mb": 100.0, "sample": "x"}


def test_each_e2e_arm_answers_with_its_lowest_dev_loss_not_its_best_test():
    bench = load_bench()
    records = [trial("LoRA r8 (q,v)", 1e-3, 1.30, 50.0), trial("LoRA r8 (q,v)", 3e-3, 1.20, 40.0),
               {"arm": "prefix L=10", "rate": 1e-3, "seed": 0, "status": "error", "reason": "OOM",
                "total_seconds": 1.0, "peak_memory_mb": None}]
    rows = {row["arm"]: row for row in bench.e2e_table(records)}
    assert rows["LoRA r8 (q,v)"]["rate"] == 3e-3 and rows["LoRA r8 (q,v)"]["bleu"] == 40.0
    assert rows["prefix L=10"] == {"arm": "prefix L=10", "status": "OOM"}
    assert rows["zero-shot"]["status"] == "not run"


def test_the_sst2_rate_is_picked_by_seed_0s_dev_and_every_seed_counts_in_the_spread(monkeypatch):
    bench = load_bench()
    monkeypatch.setattr(bench, "_minilm_records", lambda: [])

    def run(rate, seed, dev, test):
        return {"rate": rate, "seed": seed, "status": "ok", "dev_metric": dev, "test": {"accuracy": test},
                "params_pct": 0.3, "total_seconds": 20.0}

    records = [run(1e-3, 0, 0.85, 0.80), run(1e-3, 1, 0.80, 0.70), run(3e-3, 0, 0.84, 0.90)]
    rows = {row["delta"]: row for row in bench.sst2_table(records, type("A", (), {"model": "m"}))}
    picked = rows["LoRA r8 (q,v) @0.001"]
    assert picked.get("picked_by_dev") and "picked_by_dev" not in rows["LoRA r8 (q,v) @0.003"]
    assert picked["seeds"] == 2 and picked["test_mean"] == 75.0 and picked["test_min"] == 70.0
