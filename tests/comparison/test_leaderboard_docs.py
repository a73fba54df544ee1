"""The leaderboard on docs/compare.md is the one ``benchmarks/compare/leaderboard.py`` wrote to
``benchmarks/results/compare/leaderboard.json`` (issue 28, done-when 3): the page's section is
re-rendered from the JSON and must be identical, commands included."""

from __future__ import annotations

import importlib.util
import json
import shlex

from tests.helpers.doc_blocks import ROOT

SCRIPT = ROOT / "benchmarks" / "compare" / "leaderboard.py"
RESULT = ROOT / "benchmarks" / "results" / "compare" / "leaderboard.json"


def _script():
    spec = importlib.util.spec_from_file_location("leaderboard", SCRIPT)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_docs_leaderboard_is_rendered_from_the_benchmark_json():
    script = _script()
    doc = json.loads(RESULT.read_text())
    page = (ROOT / "docs" / "compare.md").read_text()
    section = page.split(script.START, 1)[1].split(script.END, 1)[0]
    assert script.START + section + script.END == script.render_docs(doc)
    assert [c["name"] for c in doc["cases"]] == list(script.CASES) and not doc["header"]["quick"]
    for case in doc["cases"]:  # each table was made by the command printed above it
        algorithms = (script.SOFTMAX_ALGORITHMS if case["name"] == "digits-softmax"
                      else script.ALGORITHMS)
        assert case["command"] == shlex.join(script.command(
            case["name"], algorithms, doc["header"]["seed"], f"runs/compare-{case['name']}"))
        assert [r["algorithm"] for r in case["algorithms"]] == algorithms.split(",")
