"""Issue 31's surviving mutants, as data, and a monkeypatch that runs one of them in-process.

A "mutant must fail" test applies the same one-line edit the mutation audit made (``old`` ->
``new`` inside one function), rebuilds that function from its source in its own module's
namespace, patches every module that holds it, and asserts that the check written against the
maths then fails. ``benchmarks/mutation/survivors.py`` applies the same edits to a scratch copy of
the repository and runs the killing tests there.
"""

from __future__ import annotations
import __future__

import importlib
import inspect
import sys
import textwrap
from typing import NamedTuple


class Mutant(NamedTuple):
    module: str
    function: str
    old: str
    new: str

    @property
    def path(self) -> str:
        return self.module.replace(".", "/") + ".py"


SURVIVORS: dict[str, Mutant] = {
    "M26": Mutant("fedbayes_flwr.algorithms.pvi.client", "free_energy_term",
                  "return state, term - G.expected_dot(state.value, posterior)", "return state, term"),
    "M11": Mutant("fedbayes_flwr.algorithms.pdmc.sampler", "_slopes",
                  "b = np.abs(v) @ potential.hess_abs.T",
                  "b = 0.5 * (np.abs(v) @ potential.hess_abs.T)"),
    "M03": Mutant("fedbayes_flwr.algorithms.pvi.server", "server_step",
                  "posterior = G.add(posterior, damped)", "posterior = G.add(posterior, reply.delta)"),
    "M07": Mutant("fedbayes_flwr.algorithms.dsvgd.bundle", "server_merge",
                  "weight = len(uploads) - 1", "weight = len(uploads)"),
    "M21": Mutant("fedbayes_flwr.seeds", "derive_seed",
                  "int(server_round), int(partition_id) + 1]", "int(server_round)]"),
    "M25": Mutant("fedbayes_flwr.algorithms.pvi.server", "optimise_prior_scale",
                  "second = float(mean @ mean + (cov.sum() if state.posterior.is_diag else np.trace(cov)))",
                  "second = float(mean @ mean)"),
    "M19c": Mutant("fedbayes_flwr.runtime.validation", "check_message",
                   "if np.isnan(got) or (np.isinf(got) and field not in allow_inf):",
                   "if np.isinf(got) and field not in allow_inf:"),
    "M04": Mutant("fedbayes_flwr.algorithms.pvi.server", "staleness_step",
                  "tau = max(0, state.server_round - (int(request_round) - 1))",
                  "tau = max(0, state.server_round - int(request_round))"),
}

#: Other mutants the audit named: the doubled cavity passed the conjugate exactness tests.
OTHERS: dict[str, Mutant] = {
    "cavity-x2": Mutant("fedbayes_flwr.algorithms.pvi.client", "cavity_for",
                        "return G.sub(posterior, factor)",
                        "return G.sub(posterior, G.scale(factor, 2.0))"),
}


def apply(monkeypatch, name: str):
    """Patch survivor ``name`` in: every loaded module's reference to the original function is
    replaced by the mutated one (``from x import f`` copies included). Returns the mutant."""
    mutant = {**SURVIVORS, **OTHERS}[name]
    module = importlib.import_module(mutant.module)
    original = getattr(module, mutant.function)
    source = textwrap.dedent(inspect.getsource(original))
    if source.count(mutant.old) != 1:
        raise AssertionError(f"{name}: {mutant.old!r} is not in {mutant.module}.{mutant.function} "
                             "exactly once (update tests/helpers/mutants.py with the code)")
    namespace: dict = {}
    code = compile(source.replace(mutant.old, mutant.new), inspect.getsourcefile(original) or name,
                   "exec", flags=__future__.annotations.compiler_flag, dont_inherit=True)
    exec(code, module.__dict__, namespace)  # noqa: S102 - the audited one-line edit
    mutated = namespace[mutant.function]
    for loaded in list(sys.modules.values()):
        for attr, value in list(getattr(loaded, "__dict__", {}).items()):
            if value is original:
                monkeypatch.setattr(loaded, attr, mutated)
    return mutated
