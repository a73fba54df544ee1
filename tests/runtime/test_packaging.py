"""Packaging: one version (pyproject, read back from the package metadata), the Python versions
pyproject claims include the one CI runs, a Keep-a-Changelog CHANGELOG."""

import pathlib
import re
import tomllib
from importlib import metadata

import fedbayes_flwr

ROOT = pathlib.Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_the_version_is_written_once_and_read_from_the_metadata():
    version = PYPROJECT["project"]["version"]
    text = (ROOT / "pyproject.toml").read_text()
    assert text.count(f'"{version}"') == 1, "the version string appears more than once"
    assert "dynamic" not in PYPROJECT["project"]
    source = (ROOT / "fedbayes_flwr" / "__init__.py").read_text()
    assert 'metadata.version("fedbayes-flwr")' in source and version not in source
    assert fedbayes_flwr.__version__ == metadata.version("fedbayes-flwr")


def test_python_versions_cover_what_ci_runs():
    project = PYPROJECT["project"]
    assert project["requires-python"] == ">=3.11"
    claimed = {c.rsplit(" :: ", 1)[1] for c in project["classifiers"]
               if re.fullmatch(r"Programming Language :: Python :: 3\.\d+", c)}
    assert claimed == {"3.11", "3.12", "3.13"}
    ci = set(re.findall(r"python(3\.\d+) -m venv", (ROOT / ".ci" / "run").read_text()))
    assert ci and ci <= claimed, ci
    assert f"py{min(claimed).replace('.', '')}" == PYPROJECT["tool"]["ruff"]["target-version"]
    assert PYPROJECT["tool"]["mypy"]["python_version"] == min(claimed)


def test_changelog_follows_keep_a_changelog():
    text = (ROOT / "CHANGELOG.md").read_text()
    assert text.startswith("# Changelog") and "keepachangelog.com" in text
    releases = re.findall(r"^## \[([^\]]+)\]", text, flags=re.M)
    assert releases[0] == "Unreleased" and PYPROJECT["project"]["version"] in releases
    sections = set(re.findall(r"^### (\w+)", text, flags=re.M))
    assert sections <= {"Added", "Changed", "Deprecated", "Removed", "Fixed", "Security"}
    assert (ROOT / "LICENSE").is_file()
