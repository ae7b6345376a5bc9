"""The built-in delta methods, one file each: its config, where it goes and what it builds there, how it is
counted, and its peft form (autopelt/delta/registry.py). Importing this package registers them, in the order
`autopelt methods` and the search spaces list them."""

import importlib

BUILT_IN = ("lora", "adapter", "prefix", "prompt", "bitfit", "adamix", "ia3", "vera")

for _name in BUILT_IN:
    importlib.import_module(f"{__name__}.{_name}")
