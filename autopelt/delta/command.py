"""`autopelt methods`: every delta method with its parameters and defaults, and the presets."""

from __future__ import annotations

import dataclasses
import json


def add_arguments(parser) -> None:
    parser.add_argument("--json", action="store_true", help="print the methods as JSON")


def run(args) -> int:
    from autopelt.delta.presets import PRESETS
    from autopelt.delta.spec import ADAPTER_PRESETS, METHODS

    if args.json:
        print(json.dumps({name: _fields(cls) for name, cls in METHODS.items()}, indent=2, default=str))
        return 0
    for name, cls in METHODS.items():
        print(f"{name}: {cls.summary}")
        for field, (default, help_text) in _fields(cls).items():
            print(f"    {field:<15} {json.dumps(default, default=str):<22} {help_text}")
        print()
    print("adapter variants: " + ", ".join(f"{n} ({json.dumps(v)})" for n, v in ADAPTER_PRESETS.items()))
    print("presets (autopelt train --preset NAME): " + ", ".join(PRESETS))
    return 0


def _fields(cls) -> dict:
    out = {}
    for f in dataclasses.fields(cls):
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        if dataclasses.is_dataclass(default):
            default = default.to_dict()
        out[f.name] = (list(default) if isinstance(default, tuple) else default, f.metadata.get("help", ""))
    return out
