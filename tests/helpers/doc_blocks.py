"""The README's and the docs' code blocks, and a fresh login shell in a clean copy of the repository
to run them in, as a new user would after the set-up commands.

* :func:`pages` / :func:`blocks`: every fenced block of ``README.md`` and ``docs/**/*.md`` in page
  order, with ``--8<--`` includes (pymdownx.snippets, as the site renders them) expanded.
* :func:`clean_clone`: the files a clone of this working tree would hold (tracked files and untracked
  files git does not ignore; no ``.venv``, ``runs/``, caches), copied to a new directory. The
  set-up commands are **simulated**: instead of ``python3.11 -m venv .venv && .venv/bin/pip install
  -e ".[dev]"`` (minutes), the copy's ``.venv`` is a symbolic link to the virtual environment the
  tests run in, which that set-up built (``.ci/run`` builds it from the same two commands).
* :func:`login_env` / :func:`run_login`: ``bash -l`` with this process's environment minus every
  trace of that virtual environment (``VIRTUAL_ENV``, its ``bin`` on ``PATH``, ``PYTHONPATH``), so a
  command finds ``python`` or ``flwr`` only if the page activates the environment as the README
  says (``source .venv/bin/activate``); nothing substitutes the interpreter.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
VENV = Path(sys.prefix)  # the environment the tests run in: what the set-up commands built
ACTIVATE = "source .venv/bin/activate"
FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```[ \t]*$", re.S | re.M)
SNIPPET = re.compile(r'^--8<-- "([^":]+)(?::(\d+))?(?::(\d+))?"[ \t]*$', re.M)


@dataclass(frozen=True)
class Block:
    page: str  # relative to the repository root
    index: int  # position among the page's fenced blocks
    lang: str  # the fence's info string: bash, python, sh, text, ...
    code: str
    included: str = ""  # the file a ``--8<--`` line put here ("" for code written on the page)


def pages() -> list[str]:
    """README.md, then every docs page (sorted), relative to the repository root."""
    return ["README.md", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").rglob("*.md"))]


def _include(m: re.Match) -> str:
    """The text a ``--8<-- "FILE[:START[:END]]"`` line stands for (1-based, inclusive lines)."""
    lines = (ROOT / m.group(1)).read_text(encoding="utf-8").splitlines(keepends=True)
    start = int(m.group(2) or 1) - 1
    end = int(m.group(3)) if m.group(3) else len(lines)
    return "".join(lines[start:end])


def blocks(page: str) -> list[Block]:
    """Every fenced block of ``page`` with ``--8<--`` includes expanded as the site renders them:
    an include line inside a fence (the skeleton bundle on the adding-an-algorithm page) fills
    that block, one between fences (benchmarks/README.md on the benchmarks page) brings its own
    fences; both kinds are marked with the file they came from."""
    text = (ROOT / page).read_text(encoding="utf-8")
    found: list[Block] = []

    def gap(piece: str) -> None:  # markdown between two fences: included pages bring blocks
        for inc in SNIPPET.finditer(piece):
            for m in FENCE.finditer(_include(inc)):
                found.append(Block(page, len(found), m.group(1), m.group(2), inc.group(1)))

    last = 0
    for m in FENCE.finditer(text):
        gap(text[last:m.start()])
        code, inc = m.group(2), SNIPPET.fullmatch(m.group(2).strip())
        found.append(Block(page, len(found), m.group(1), _include(inc) if inc else code,
                           inc.group(1) if inc else ""))
        last = m.end()
    gap(text[last:])
    return found


def clean_clone(dest: Path) -> Path:
    """A clean clone of the working tree at ``dest`` with the set-up simulated (``.venv`` linked)."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                            cwd=ROOT, capture_output=True, check=True).stdout.decode().split("\0")
    for rel in filter(None, listed):
        src = ROOT / rel
        if src.is_file():  # a tracked file deleted in the working tree is not in the clone
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)
    (dest / ".venv").symlink_to(VENV, target_is_directory=True)
    return dest


def login_env(**extra: str) -> dict[str, str]:
    """This process's environment without the virtual environment (see the module docstring)."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME", "PYTEST_CURRENT_TEST")}
    hidden = {str(VENV / "bin"), str(Path(sys.executable).parent)}
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep)
                                  if p and p not in hidden)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # TensorFlow's start-up lines only
    env.update(extra)
    return env


def run_login(script: str, cwd: Path, env: dict[str, str], timeout: float,
              log: Path | None = None) -> subprocess.CompletedProcess:
    """``bash -l SCRIPT`` in ``cwd`` (the script written to a file next to ``cwd``)."""
    path = cwd.parent / f"{cwd.name}-script-{abs(hash(script))}.sh"
    path.write_text(script, encoding="utf-8")
    proc = subprocess.run(["bash", "-l", str(path)], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)
    if log is not None:
        with log.open("a", encoding="utf-8") as fh:
            fh.write(f"$ bash -l {path}\n{proc.stdout}{proc.stderr}\n")
    return proc
