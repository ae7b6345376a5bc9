"""bench/step_times.py render: the ratios of every row and the tables it writes between docs/speed.md's markers."""

from __future__ import annotations

import pytest
from support.benches import load_bench


def load_doc():
    return load_bench("step_times")


def row(label, mode, attention, precision, seconds):
    return {"configuration": label, "backbone_dropout": mode, "attention": attention, "precision": precision,
            "trainable_params": 10, "seconds": seconds, "times": [seconds]}


RESULTS = {
    "command": "python bench/step_times.py", "commit": "abc", "date": "2026-11-26", "torch": "2", "threads": 2,
    "model": "m", "seq": 128, "batch": 32, "steps": 2, "warmup": 1, "precisions": ["fp32", "bf16"],
    "dropouts": ["model", "off"], "attentions": ["sdpa"],
    "machine": {"cpu_model": "AMD EPYC", "cpus": "2", "amx": False, "avx512_bf16": True},
    "rows": [row("frozen forward", "–", "sdpa", "fp32", 0.5), row("frozen forward", "–", "sdpa", "bf16", 0.25),
             row("peft LoRA r8 (q,v)", "model", "sdpa", "fp32", 2.0),
             row("peft LoRA r8 (q,v)", "off", "sdpa", "fp32", 1.0),
             row("peft LoRA r8 (q,v)", "model", "sdpa", "bf16", 1.0),
             row("dora r8 (q,v)", "model", "sdpa", "fp32", 2.2), row("dora r8 (q,v)", "off", "sdpa", "fp32", 1.5),
             row("dora r8 (q,v)", "model", "sdpa", "bf16", 1.1)],
}


def test_every_ratio_is_against_the_same_precision_attention_and_dropout():
    doc = load_doc()
    rows = {(r["configuration"], r["backbone_dropout"], r["precision"]): r for r in doc.ratios(RESULTS)}
    dora = rows[("dora r8 (q,v)", "model", "bf16")]
    assert dora["x_fp32"] == pytest.approx(0.5) and dora["x_peft_lora"] == pytest.approx(1.1)
    assert dora["x_floor"] == pytest.approx(1.1 / 0.5)  # twice the bf16 forward
    assert rows[("dora r8 (q,v)", "off", "fp32")]["x_peft_lora"] == pytest.approx(1.5)
    assert rows[("dora r8 (q,v)", "off", "fp32")]["x_fp32"] is None  # an fp32 row has no fp32 ratio


def test_the_tables_replace_what_stood_between_the_markers():
    doc = load_doc()
    text = f"# Speed\nbefore\n{doc.START}\nold table\n{doc.END}\nafter\n"
    rendered = doc.render(RESULTS, text)
    assert "old table" not in rendered and rendered.startswith("# Speed\nbefore\n") and rendered.endswith("after\n")
    assert "not measured on AMX here" in rendered
    assert "| dora r8 (q,v) | model | 10 | 1.100 | 0.50 | 1.10 | 2.20 |" in rendered
    assert "| dora r8 (q,v) | off |" not in rendered.split("**bf16**")[1]  # not measured in bf16: no row
    with pytest.raises(ValueError, match="markers"):
        doc.render(RESULTS, "no markers")


def test_the_overall_ratios_are_geometric_means_over_configurations_measured_both_ways():
    doc = load_doc()
    overall = {(precision, name): (ratio, n) for precision, name, ratio, n in doc.overall(RESULTS)}
    assert overall[("fp32", "off / model")] == (pytest.approx((1.0 / 2.0 * 1.5 / 2.2) ** 0.5), 2)
    assert overall[("–", "bf16 / fp32")] == (pytest.approx(0.5), 2)  # peft LoRA and DoRA, model dropout
    assert ("bf16", "off / model") not in overall  # nothing measured both ways


def test_compiled_rows_are_compared_with_their_eager_step_and_say_when_compilation_repays():
    doc = load_doc()
    compiled = [{**row("peft LoRA r8 (q,v) · compiled", "model", "sdpa", "fp32", 1.5), "first_seconds": 31.5},
                {**row("dora r8 (q,v) · compiled", "model", "sdpa", "fp32", 2.5), "first_seconds": 12.5}]
    results = {**RESULTS, "rows": RESULTS["rows"] + compiled}
    overall = {(precision, name): (ratio, n) for precision, name, ratio, n in doc.overall(results)}
    assert overall[("fp32", "compiled / eager")] == (pytest.approx((1.5 / 2.0 * 2.5 / 2.2) ** 0.5), 2)
    assert overall[("fp32", "off / model")][1] == 2  # compiled rows join no other comparison
    table = doc.compile_table(results)
    assert "| peft LoRA r8 (q,v) | fp32 | 30.0 | 2.000 | 1.500 | 60 |" in table  # 30 s to save 0.5 s a step
    assert "| dora r8 (q,v) | fp32 | 10.0 | 2.200 | 2.500 | never |" in table
    assert doc.compile_table(RESULTS) == ""
