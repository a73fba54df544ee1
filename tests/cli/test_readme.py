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

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
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


def _pytest_commands() -> list[list[str]]:
    """Every ``python -m pytest`` command in a bash block (the test commands the README shows)."""
    out = []
    for block in re.findall(r"```bash\n(.*?)```", README, flags=re.S):
        for command in block.splitlines():
            if " -m pytest" in command:
                words = shlex.split(command)
                out.append(words[words.index("pytest") + 1:])
    return out


def test_readme_test_commands_select_tests():
    """The README's test commands: the default suite (what ``.ci/run`` runs, which fails on
    pytest's exit 5 itself) and the deployment tests, which must collect exactly the tests that
    start real processes (exit 5 there would be a silent failure)."""
    commands = _pytest_commands()
    assert ["-q"] in commands and ["-q", "-m", "deployment"] in commands
    for args in [c for c in commands if c != ["-q"]]:
        proc = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", *args],
                              capture_output=True, text=True, timeout=600, cwd=ROOT)
        assert proc.returncode == 0, (args, proc.stdout[-2000:], proc.stderr[-2000:])
        selected = [ln for ln in proc.stdout.splitlines() if "::" in ln]
        assert selected, args
        if "deployment" in args:  # only the deployment tests, and all of them are marked
            assert all(ln.split("::")[0].endswith(("test_deployment.py", "test_ray_cluster.py",
                                                    "test_flwr_run.py", "test_resume.py", "test_api.py",
                                                    "test_new_user.py")) for ln in selected), selected
