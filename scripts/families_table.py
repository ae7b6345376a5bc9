"""Write the families x methods table of docs/families.md from the declarations themselves.

Each cell is what the code does: "trained" with the test file that trains that family with that method, or the
one-line reason autopelt refuses it (`delta.inject.why_not` on the preset, before anything is built). Run it after
changing autopelt/delta/families.py; tests/test_docs.py fails while the page differs from what it writes.

    python scripts/families_table.py            # rewrite the table in docs/families.md
    python scripts/families_table.py --check    # exit 1 if the page is out of date
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "families.md"
BLOCK = re.compile(r"(<!-- families:start -->\n).*?(<!-- families:end -->)", re.S)
COLUMNS = ("lora", "dora", "vera", "ia3", "houlsby", "adapter", "compacter++", "prefix", "prompt", "bitfit", "adamix",
           "unipelt_apl")
# The test file that trains each family with every method it takes (a shared declaration: the family it serves)
TESTED_IN = {
    **dict.fromkeys(("bert", "roberta"), "test_delta_methods.py"),
    **dict.fromkeys(("llama", "gpt2", "t5"), "test_delta_decoders.py"),
    **dict.fromkeys(("electra", "deberta-v2", "mpnet", "distilbert", "albert", "modernbert", "gemma", "gemma2",
                     "gemma3_text", "phi3", "olmo2", "bart"), "test_families.py"),
    "xlm-roberta": "roberta's declaration", "mistral": "llama's declaration", "qwen2": "llama's declaration",
    "qwen3": "llama's declaration", "mt5": "test_delta_decoders.py (t5-gated)",
}


def table() -> str:
    from autopelt.delta.families import ARCHITECTURES
    from autopelt.delta.inject import why_not
    from autopelt.delta.presets import PRESETS
    from autopelt.delta.registry import innermost
    from autopelt.delta.spec import parse_spec

    notes: dict[str, int] = {}
    rows = ["| family (model type) | " + " | ".join(COLUMNS) + " | trained in |",
            "|---|" + "---|" * len(COLUMNS) + "---|"]
    for family, arch in [*ARCHITECTURES.items(), ("any other, e.g. opt", _read_by_structure())]:
        cells = []
        for column in COLUMNS:
            reasons = [why_not(innermost(m), arch) for m in parse_spec(PRESETS[column]).methods]
            reason = next((r for r in reasons if r), None)
            if reason is None:
                cells.append("✓")
            else:
                number = notes.setdefault(reason, len(notes) + 1)
                cells.append(f"– ({number})")
        rows.append(f"| {family} | " + " | ".join(cells) + f" | {TESTED_IN.get(family, 'test_discover.py')} |")
    lines = rows + [""] + [f"({number}) {reason}" + "  " for reason, number in notes.items()]
    return "\n".join(lines) + "\n"


def _read_by_structure():
    """What discover.py reads of a model type declared nowhere: OPT's, from a tiny config (no weights)."""
    from transformers import OPTConfig

    from autopelt.delta.discover import _config_json, _discover

    config = OPTConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, ffn_dim=64, num_attention_heads=4,
                       word_embed_proj_dim=32)
    return _discover(_config_json(config), type(config))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if docs/families.md is out of date")
    args = parser.parse_args()
    text = PAGE.read_text()
    if not BLOCK.search(text):
        print(f"{PAGE} has no '<!-- families:start -->' block", file=sys.stderr)
        return 2
    new = BLOCK.sub(lambda m: m.group(1) + table() + m.group(2), text)
    if args.check:
        return 0 if new == text else 1
    PAGE.write_text(new)
    print(table())
    return 0


if __name__ == "__main__":
    sys.exit(main())
