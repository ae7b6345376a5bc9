"""Writing a file so that nobody ever sees half of it."""

from __future__ import annotations

import os
import secrets
from pathlib import Path
from typing import Callable


def write_atomic(path: str | Path, content: str | bytes | Callable[[Path], None]) -> Path:
    """Write `content` (text, bytes, or a function that writes the path it is given) to `path` through a
    temporary file in the same folder, flushed to disk, then renamed over `path`. A reader, or a process
    killed meanwhile, finds the old file or the whole new one; two writers of one path each leave a whole
    file. The file gets the usual permissions (0666 less the umask)."""
    path = Path(path)
    temporary = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    os.close(os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))  # os.open honours the umask
    try:
        if callable(content):
            content(temporary)
        elif isinstance(content, bytes):
            temporary.write_bytes(content)
        else:
            temporary.write_text(content, encoding="utf-8")
        fd = os.open(temporary, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)
    return path
