"""Whether the Hugging Face hub can be asked, decided once and quickly.

The hub clients retry an unreachable host with back-off, for tens of seconds per file. Here offline mode
(`HF_HUB_OFFLINE`, `TRANSFORMERS_OFFLINE`) is honoured up front, and otherwise one connection attempt to the
endpoint decides: when it fails, models load with `local_files_only` and data sets from the `datasets` cache,
or the caller gives its one-line error at once. Nothing heavy is imported here.
"""

from __future__ import annotations

import os
import socket
import ssl
import time
import urllib.error
import urllib.request
from contextlib import contextmanager
from pathlib import Path

DEFAULT_ENDPOINT = "https://huggingface.co"
PROBE_TIMEOUT = 3.0  # seconds for the one connection attempt; a reachable hub answers far sooner
REMEMBER = 60.0  # seconds an answer is reused: a notebook that comes back online finds out within a minute
_TRUE = {"1", "ON", "YES", "TRUE"}
_answers: dict[str, tuple[float, str | None]] = {}


def endpoint() -> str:
    return os.environ.get("HF_ENDPOINT", DEFAULT_ENDPOINT).rstrip("/")


def _offline_variable(datasets: bool) -> str | None:
    """The variable by which the user said offline (for data sets `HF_DATASETS_OFFLINE` counts too), or None."""
    names = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE") + (("HF_DATASETS_OFFLINE",) if datasets else ())
    return next((name for name in names if os.environ.get(name, "").strip().upper() in _TRUE), None)


def unreachable(datasets: bool = False) -> str | None:
    """None when the hub may be asked; else why not, in a few words for an error message."""
    variable = _offline_variable(datasets)
    if variable:
        return f"offline mode: {variable} is set"
    url = endpoint()
    asked, answer = _answers.get(url, (float("-inf"), None))
    if time.monotonic() - asked > REMEMBER:
        answer = _probe(url)
        _answers[url] = (time.monotonic(), answer)
    return answer


def _probe(url: str) -> str | None:
    """One HEAD request, no retries (proxies from the environment apply, as for the hub clients)."""
    try:
        urllib.request.urlopen(urllib.request.Request(url, method="HEAD"), timeout=PROBE_TIMEOUT).close()
    except urllib.error.HTTPError:
        return None  # it answered, if only with an error status: the hub clients take it from here
    except urllib.error.URLError as error:
        if isinstance(error.reason, ssl.SSLError):
            return None  # something answered; the hub clients have their own certificate settings
        return f"{url}: {_describe(error.reason)}"
    except (TimeoutError, socket.timeout):
        return f"{url}: no answer in {PROBE_TIMEOUT:g} s"
    except OSError as error:
        return f"{url}: {_describe(error)}"
    return None


def _describe(reason) -> str:
    if isinstance(reason, socket.gaierror):
        return "name not resolved"
    if isinstance(reason, (TimeoutError, socket.timeout)):
        return f"no answer in {PROBE_TIMEOUT:g} s"
    return getattr(reason, "strerror", None) or str(reason) or type(reason).__name__


def datasets_cache() -> Path:
    """Where `datasets` keeps prepared data sets (its own rule: HF_DATASETS_CACHE, else HF_HOME/datasets)."""
    if os.environ.get("HF_DATASETS_CACHE"):
        return Path(os.environ["HF_DATASETS_CACHE"]).expanduser()
    home = os.environ.get("HF_HOME") or Path(os.environ.get("XDG_CACHE_HOME", "~/.cache")) / "huggingface"
    return Path(home).expanduser() / "datasets"


def datasets_cache_holds(repo_id: str, config: str) -> bool:
    """Whether `datasets` has prepared `repo_id` (config `config`) before: `<cache>/<org>___<name>/<config>/…`."""
    folder = datasets_cache() / repo_id.replace("/", "___") / config
    return folder.is_dir() and any(path.is_dir() for path in folder.glob("*/*"))


@contextmanager
def datasets_offline():
    """`datasets` in offline mode for a while: it then reads its cache without asking the hub (no retries)."""
    import datasets.config

    saved = datasets.config.HF_HUB_OFFLINE
    datasets.config.HF_HUB_OFFLINE = True
    try:
        yield
    finally:
        datasets.config.HF_HUB_OFFLINE = saved
