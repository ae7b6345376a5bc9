"""Run the README's quickstart search as written and put what it printed into the README.

    python scripts/readme_quickstart.py [--dry-run]

Reads the first command of the README's Quickstart (`autopelt search …`), runs it with `autopelt` from a fresh
temporary folder (its relative `--data-dir` resolved against the checkout, so nothing else changes), and replaces
the README's first ```text block of that section with the command's output (the middle of its trial table and
the ensemble's lighter members elided, `elided`). It prints the wall time, the load
average before and after and the CPU model, for the sentence above the sample that states the time; that sentence
is written by hand. --dry-run prints the output and changes nothing.
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"


def section(text: str, title: str = "Quickstart") -> tuple[int, int]:
    """The start and end offsets of the README section `## title`."""
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return start, len(text) if end < 0 else end


def quickstart_search(text: str) -> list[str]:
    """The quickstart's first shell command (`autopelt search …`), as words, its comment dropped."""
    start, end = section(text)
    block = re.search(r"```bash\n(.*?)```", text[start:end], flags=re.S).group(1)
    words = shlex.split(block.splitlines()[0], comments=True)
    if words[:2] != ["autopelt", "search"]:
        raise SystemExit(f"the quickstart's first command is not `autopelt search`: {words}")
    return words


def with_sample(text: str, sample: str) -> str:
    """`text` with the quickstart's first ```text block replaced by `sample`."""
    start, end = section(text)
    match = re.search(r"```text\n.*?```", text[start:end], flags=re.S)
    if match is None:
        raise SystemExit("the README's Quickstart has no ```text block to fill")
    return text[:start + match.start()] + f"```text\n{sample.rstrip()}\n```" + text[start + match.end():]


TABLE_HEAD, TABLE_TAIL = 3, 1  # the table's rows the sample keeps from its start and its end
MEMBERS_KEPT = 1  # the ensemble's members the sample lists


def elided(output: str, folder: str | None = None) -> str:
    """The output as the README shows it: the trial table's middle rows and the ensemble's lighter members
    replaced by one line each saying how many, and the temporary folder it ran in left out of paths (the test
    compares what comes before the table, the summary's first line and what follows `next:`)."""
    lines = output.rstrip("\n").splitlines()
    if folder:
        lines = [line.replace(folder.rstrip("/") + "/", "") for line in lines]
    out, index = [], 0
    while index < len(lines):
        line = lines[index]
        out.append(line)
        index += 1
        if line.lstrip().startswith("trial ") and "delta" in line:  # the table's head: its rows follow
            end = index
            while end < len(lines) and lines[end].startswith("  ") and lines[end].strip():
                end += 1
            rows = lines[index:end]
            if len(rows) > TABLE_HEAD + TABLE_TAIL + 1:
                rows = rows[:TABLE_HEAD] + [f"   …  ({len(rows) - TABLE_HEAD - TABLE_TAIL} more rows)"] + \
                    rows[-TABLE_TAIL:]
            out.extend(rows)
            index = end
        elif line.startswith("ensemble of "):  # its members, heaviest first
            end = index
            while end < len(lines) and re.match(r"^  \d\.\d{3} × ", lines[end]):
                end += 1
            members = lines[index:end]
            out.extend(members[:MEMBERS_KEPT])
            if len(members) > MEMBERS_KEPT:
                out.append(f"  …  ({len(members) - MEMBERS_KEPT} more members)")
            index = end
    return "\n".join(out) + "\n"


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true", help="print the output; change nothing")
    parser.add_argument("--output", help="a search's saved output (with --folder, the folder it ran in) to write "
                                         "into the README instead of running the search again")
    parser.add_argument("--folder", help="with --output: the temporary folder the search ran in")
    args = parser.parse_args(argv)
    if args.output:
        README.write_text(with_sample(README.read_text(), elided(Path(args.output).read_text(), args.folder)))
        return 0
    text = README.read_text()
    words = quickstart_search(text)
    if "--data-dir" in words:  # relative to the checkout, as the README's reader runs it
        at = words.index("--data-dir") + 1
        words[at] = str((ROOT / words[at]).resolve())
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as folder:
        started = time.monotonic()
        done = subprocess.run(words, cwd=folder, capture_output=True, text=True)
        seconds = time.monotonic() - started
        sample = elided(done.stdout, folder)
    load_after = os.getloadavg()
    if done.returncode != 0:
        sys.stderr.write(done.stdout + done.stderr)
        raise SystemExit(f"the quickstart's search failed (exit {done.returncode})")
    print(done.stdout, end="")
    print(f"\n{seconds / 60:.0f} min {seconds % 60:.0f} s on {cpu_model()} ({os.cpu_count()} CPUs); load average "
          f"{load_before[0]:.1f} before, {load_after[0]:.1f} after (1 min), {load_after[2]:.1f} over 15 min",
          file=sys.stderr)
    if not args.dry_run:
        README.write_text(with_sample(README.read_text(), sample))  # read again: edits made meanwhile stay
        print(f"wrote the sample into {README.relative_to(ROOT)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
