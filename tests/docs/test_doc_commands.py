"""Every command block of the README and the docs runs as written, in a fresh shell, from a clean
clone, after the set-up commands (issue 25).

How (see ``tests/helpers/doc_blocks.py``): each page's ``bash`` and ``python`` blocks become ONE
``bash -l`` script (one per page, to pay TensorFlow's import once per command, not per test), run
from the root of a clean copy of the working tree whose ``.venv`` is a link to the environment the
tests run in: the set-up commands (``python3.11 -m venv .venv && .venv/bin/pip install -e
".[dev]"``) are SIMULATED by that link. The script starts with the README's activation line
(``source .venv/bin/activate``); the shell's environment holds no trace of the virtual environment
before it, so no interpreter is substituted: ``python`` is whatever the activated shell finds.
``python`` blocks run as ``python - <<'EOF'`` from the clone's root, as pasted into the activated
shell.

What each ``bash`` block is (:func:`kind`; every command of a block must be of one kind):

* ``run``: run here, verbatim, under the ``docs`` marker (``.ci/run`` runs ``pytest -m docs`` as its
  own invocation); the docs write these commands with small settings, nothing is appended.
* ``setup``: the README's first set-up command. The venv and ``pip install`` part is simulated (the
  link above); the run it ends with is run here verbatim with ``--num-rounds 1`` APPENDED (the last
  ``--num-rounds`` wins; 10 rounds through the Simulation Engine would cost a minute more). The
  same command elsewhere (getting started) must be identical and is run once.
* ``ci``: ``.venv/bin/python -m pytest ...``: the test commands; each must be one that ``.ci/run``
  runs as written (running the suite from inside the suite would recurse).
* ``flwr``: ``flwr run ...``: run verbatim in a fresh ``bash -l`` after activation by
  ``tests/flower/test_flwr_run.py`` (marker ``deployment``: it starts Flower's local SuperLink).
* ``deployment``: ``run_simulation.py --engine deployment``: run here under ``deployment``.
* ``benchmark``: the commands on the benchmarks page (``benchmarks/README.md``, included): they
  measure for minutes to hours, so they are checked, not run: the script exists and every option
  the command gives is one the script (or ``benchmarks/common.py``) defines; the ``hub:`` commands
  there need the network and are run on local stand-ins by ``tests/data/test_hub_data.py``.

``sh`` blocks are for other machines (real devices, a Ray cluster) and appear only on the two pages
that say so; an included ``python`` block (the skeleton bundle) is the file
``tests/helpers/toy_algorithm.py``, which ``tests/algorithms/test_genericity.py`` runs and the
page's own ``bash`` block loads through the CLI.
"""

from __future__ import annotations

import re
import resource
import shlex
import time

import pytest
import yaml

from tests.helpers.doc_blocks import (
    ACTIVATE,
    ROOT,
    Block,
    blocks,
    clean_clone,
    login_env,
    pages,
    run_login,
)

SETUP_PREFIX = 'python3.11 -m venv .venv && .venv/bin/pip install -e ".[dev]" && '
SETUP_OVERRIDE = " --num-rounds 1"  # appended to the set-up's run (see the module docstring)
SH_PAGES = {"docs/deployment.md", "docs/scaling-out.md"}  # real devices; a multi-machine cluster
PAGE_TIMEOUT_S = 900  # a hang, not a budget: the budget is the marker's (.ci/run)
PY_EOF = "FEDBAYES_DOCS_PY"


def _commands(code: str) -> list[str]:
    """A bash block's commands: continuation lines joined, comments and blank lines dropped."""
    joined = code.replace("\\\n", " ")
    return [line.strip() for line in joined.splitlines()
            if line.strip() and not line.strip().startswith("#")]


def _kind_of(command: str, block: Block) -> str:
    if block.included == "benchmarks/README.md":
        return "benchmark"
    if command.startswith("python3.11 -m venv"):
        return "setup"
    if " -m pytest" in command:
        return "ci"
    if command.startswith("flwr run"):
        return "flwr"
    if "--engine deployment" in command:
        return "deployment"
    return "run"


def kind(block: Block) -> str:
    kinds = {_kind_of(c, block) for c in _commands(block.code)}
    assert len(kinds) == 1, f"{block.page} block {block.index} mixes {sorted(kinds)}: split it"
    return kinds.pop()


ALL = [b for page in pages() for b in blocks(page)]
BASH = [b for b in ALL if b.lang == "bash"]


def _setup_block() -> Block:
    setup = [b for b in BASH if kind(b) == "setup"]
    assert setup and setup[0].page == "README.md", "the README shows the set-up command first"
    return setup[0]


def _page_script(page: str) -> str | None:
    """The page's ``run`` blocks and its own ``python`` blocks, in order, after activation."""
    parts = []
    for b in blocks(page):
        if b.lang == "bash" and kind(b) in ("run", "setup"):
            code = b.code
            if kind(b) == "setup":
                if page != "README.md":  # the same command as the README's, run there once
                    assert b.code == _setup_block().code, page
                    continue
                (command,) = _commands(b.code)
                assert command.startswith(SETUP_PREFIX), command
                code = command[len(SETUP_PREFIX):] + SETUP_OVERRIDE + "\n"
            parts.append(f'echo "::: {page} block {b.index} (bash) $(date +%s)" >&2\n{code}')
        elif b.lang == "python" and not b.included:
            assert PY_EOF not in b.code
            parts.append(f'echo "::: {page} block {b.index} (python) $(date +%s)" >&2\n'
                         f"python - <<'{PY_EOF}'\n{b.code}{PY_EOF}\n")
    if not parts:
        return None
    which = 'echo "::: python is $(command -v python)" >&2\n'
    trace = "PS4='+ $(date +%s.%N | cut -c1-14) '\nset -x\n"  # each command with its start time
    return "set -eo pipefail\n" + ACTIVATE + "\n" + which + trace + "\n".join(parts)


def _uses_flower(script: str) -> bool:
    """A page whose script starts Flower's Simulation Engine (a CLI run without another engine,
    or ``flwr.simulation.run_simulation`` from Python)."""
    runs = [c for c in script.splitlines() if "run_simulation.py" in c and "--help" not in c]
    return "from flwr.simulation import run_simulation" in script or any(
        "--engine" not in c and "--resume" not in c for c in runs)


PAGE_SCRIPTS = {page: s for page in pages() if (s := _page_script(page))}


# ------------------------------------------------------------------ cheap checks (default suite)
def test_every_block_is_of_a_known_kind():
    assert len(BASH) >= 30, len(BASH)  # README and docs together; benchmarks included
    for b in ALL:
        assert b.lang in ("bash", "python", "sh", "text", ""), (b.page, b.index, b.lang)
        if b.lang == "sh":
            assert b.page in SH_PAGES, f"{b.page} block {b.index}: a sh block nothing runs"
        if b.lang == "bash":
            assert kind(b) in ("run", "setup", "ci", "flwr", "deployment", "benchmark")
            assert not re.search(r"\s\[--", b.code), \
                f"{b.page} block {b.index}: a synopsis with optional [--..] parts: fence it as text"
    assert ACTIVATE in [b.code.strip() for b in BASH if b.page == "README.md"]
    assert {"README.md", "docs/getting-started.md", "docs/own-model.md",
            "docs/flower-app.md"} <= set(PAGE_SCRIPTS)


def test_test_commands_are_the_ones_ci_runs():
    """A ``ci`` block's commands are ``.ci/run``'s ``run_pytest`` invocations, argument for argument
    (``.ci/run`` runs them with the venv's interpreter, ``.venv/bin/python -m pytest``)."""
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    runs = [shlex.split(m.split("#")[0]) for m in re.findall(r"^run_pytest (.*)$", ci, re.M)]
    shown = [b for b in BASH if kind(b) == "ci"]
    assert shown
    for b in shown:
        for command in _commands(b.code):
            words = shlex.split(command)
            assert words[:3] == [".venv/bin/python", "-m", "pytest"], command
            assert words[3:] in runs, (command, runs)
    assert ["-q"] in runs  # the README's test command is the default suite


def test_deployment_test_command_selects_only_the_deployment_tests():
    """``pytest -m deployment`` (shown in the README, run by ``.ci/run``) collects tests, and only
    those that start real processes (exit 5 in CI would fail; a wrong selection would not)."""
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-m", "deployment"],
                          capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, (proc.stdout[-2000:], proc.stderr[-2000:])
    selected = [ln for ln in proc.stdout.splitlines() if "::" in ln]
    assert selected
    assert all(ln.split("::")[0].endswith(("test_deployment.py", "test_ray_cluster.py",
                                            "test_flwr_run.py", "test_resume.py", "test_api.py",
                                            "test_new_user.py", "test_doc_commands.py",
                                            "test_compare.py", "test_dp_pvi.py"))
               for ln in selected), selected


def test_flwr_commands_are_the_ones_the_flwr_test_runs():
    from tests.flower.test_flwr_run import FLWR_COMMANDS

    shown = [c for b in BASH if kind(b) == "flwr" for c in _commands(b.code)]
    assert shown == FLWR_COMMANDS and len(shown) == 8


def test_benchmark_commands_name_real_scripts_and_options():
    """Each benchmark command names a script that exists, and every ``--option`` it passes is
    defined by the script or by ``benchmarks/common.py`` (the shared options)."""
    common = (ROOT / "benchmarks" / "common.py").read_text(encoding="utf-8")
    checked = 0
    for b in (b for b in BASH if kind(b) == "benchmark"):
        for command in _commands(b.code):
            words = shlex.split(command.split(" #")[0])
            if any(w.startswith("hub:") for w in words):
                continue  # tests/data/test_hub_data.py
            assert words[0] == ".venv/bin/python" and words[1].startswith("benchmarks/"), command
            script = (ROOT / words[1]).read_text(encoding="utf-8")
            for option in (w.split("=")[0] for w in words[2:] if w.startswith("--")):
                assert f'"{option}"' in script or f'"{option}"' in common, (command, option)
            checked += 1
    assert checked >= 15, checked


def test_readme_is_a_landing_page():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= 250
    table = [ln for ln in readme.splitlines() if ln.startswith("| **")]
    assert len(table) == 5 and all("(docs/families/" in ln for ln in table), table
    for link in re.findall(r"\]\((docs/[^)#]+)", readme):
        assert (ROOT / link).is_file(), link
    python = [b for b in blocks("README.md") if b.lang == "python"]
    assert len(python) == 1 and "fedbayes_flwr.fit(" in python[0].code
    assert len([ln for ln in python[0].code.splitlines() if ln.strip()]) <= 12


def test_every_docs_page_is_in_the_nav():
    def leaves(node):
        if isinstance(node, str):
            yield node
        elif isinstance(node, list):
            for item in node:
                yield from leaves(item)
        elif isinstance(node, dict):
            for value in node.values():
                yield from leaves(value)

    nav = set(leaves(yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))["nav"]))
    on_disk = {p.removeprefix("docs/") for p in pages() if p.startswith("docs/")}
    assert on_disk == nav, (on_disk ^ nav)


# ------------------------------------------------------------- the commands (marker ``docs``)
def _run_page(page: str, tmp_path):
    clone = clean_clone(tmp_path / "clone")
    started, before = time.monotonic(), resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = run_login(PAGE_SCRIPTS[page], clone, login_env(), timeout=PAGE_TIMEOUT_S,
                     log=tmp_path / "shell.log")
    took, after = time.monotonic() - started, resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    # wall time depends on the machine's load; the CPU seconds of the page's processes do not
    print(f"\n{page}: {took:.1f} s wall, {cpu:.1f} s CPU")
    where = re.findall(r"^::: .*$", proc.stderr, re.M)
    assert proc.returncode == 0, (f"{page}: failed in {where[-1] if where else '?'} after "
                                  f"{took:.0f} s\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}")
    # the activated shell's python is the set-up's environment, reached through the clone's .venv
    found = re.search(r"^::: python is (.*)$", proc.stderr, re.M)
    assert found and found.group(1).endswith("/.venv/bin/python"), proc.stderr[:500]
    return clone, proc


@pytest.mark.docs
@pytest.mark.parametrize("page", [
    pytest.param(page, marks=[pytest.mark.flower] if _uses_flower(s) else [])
    for page, s in PAGE_SCRIPTS.items()])
def test_page_commands_run_as_written(page, tmp_path):
    clone, _ = _run_page(page, tmp_path)
    if page == "README.md":  # the set-up's run wrote its results where it says
        assert (clone / "runs" / "demo" / "result.json").is_file()


@pytest.mark.deployment  # a SuperLink with TLS and node authentication, one SuperNode per client
def test_deployment_page_command_runs_as_written(tmp_path):
    commands = [b for b in BASH if kind(b) == "deployment"]
    assert [b.page for b in commands] == ["docs/deployment.md"]
    clone = clean_clone(tmp_path / "clone")
    script = "set -eo pipefail\n" + ACTIVATE + "\n" + commands[0].code
    proc = run_login(script, clone, login_env(), timeout=PAGE_TIMEOUT_S)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    assert '"engine": "deployment"' in (clone / "runs" / "deployed" / "result.json").read_text()
