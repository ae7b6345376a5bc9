"""An on-disk cache of named numpy arrays (.npz, never pickle), written atomically.

Entries are immutable: a key names its content, so a hit never needs invalidating. Writers put a temporary
file beside the entry and rename it into place, so a killed process leaves either no entry or a whole one,
and two processes filling the same key both leave a valid file.
"""

from __future__ import annotations

import os
import zipfile
from pathlib import Path

import numpy as np

from autopelt.files import write_atomic

CACHE_DIR_ENV = "AUTOPELT_CACHE_DIR"


def default_cache_dir() -> Path:
    """`$AUTOPELT_CACHE_DIR`, else `~/.cache/autopelt`."""
    return Path(os.environ.get(CACHE_DIR_ENV) or Path.home() / ".cache" / "autopelt").expanduser()


def entry_path(key: str, cache_dir: str | Path | None = None, kind: str = "features") -> Path:
    """Where the entry `key` lives: `<cache dir>/<kind>/<key>.npz`."""
    return Path(cache_dir or default_cache_dir()) / kind / f"{key}.npz"


def load_arrays(path: Path) -> dict[str, np.ndarray] | None:
    """The arrays stored at `path`, or None when there is no readable entry."""
    if not path.is_file():
        return None
    try:
        with np.load(path, allow_pickle=False) as stored:
            return {name: stored[name] for name in stored.files}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile):
        return None  # damaged (e.g. a disk filled up mid-copy): recompute and overwrite


def save_arrays(path: Path, arrays: dict[str, np.ndarray]) -> None:
    """Write `arrays` to `path` atomically."""
    path.parent.mkdir(parents=True, exist_ok=True)

    def write(temporary: Path) -> None:
        with temporary.open("wb") as file:  # a file, not a name: numpy would add .npz to the name
            np.savez(file, **arrays)

    write_atomic(path, write)
