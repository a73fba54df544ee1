"""The README cannot drift from the code: its Python snippets run, and every
``run_simulation.py`` command it shows parses into a valid configuration and runs (in-process,
one update, so the default suite stays fast; the Flower engines are covered by the Flower
tests)."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
PYTHON_BLOCKS = re.findall(r"```python\n(.*?)```", README, flags=re.S)


def _commands() -> list[list[str]]:
    """Every ``run_simulation.py`` invocation in a bash block, continuation lines joined;
    synopsis lines with ``[optional]`` parts are skipped."""
    out = []
    for block in re.findall(r"```bash\n(.*?)```", README, flags=re.S):
        for command in block.replace("\\\n", " ").splitlines():
            command = command.split("&&")[-1]
            if "run_simulation.py" not in command or "[" in command:
                continue
            words = shlex.split(command)
            out.append(words[words.index(next(w for w in words if w.endswith("run_simulation.py")))
                             + 1:])
    return out


def test_readme_shows_commands_and_snippets():
    assert len(_commands()) >= 1 and len(PYTHON_BLOCKS) >= 2


@pytest.mark.parametrize("index", range(len(PYTHON_BLOCKS)))
def test_python_snippet_runs(tmp_path, index):
    proc = subprocess.run([sys.executable, "-c", PYTHON_BLOCKS[index]], capture_output=True,
                          text=True, timeout=600, cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": ROOT})
    assert proc.returncode == 0, proc.stderr[-3000:]


@pytest.mark.parametrize("index", range(len(_commands())))
def test_cli_command_runs(tmp_path, index):
    sys.path.insert(0, ROOT)
    import run_simulation

    argv = [a for a in _commands()[index]]
    # the same command in-process, one update, output in tmp_path
    code = run_simulation.main([*argv, "--engine", "in-process", "--quiet", "--num-rounds", "1",
                                "--output-dir", str(tmp_path / "out")])
    assert code == 0
