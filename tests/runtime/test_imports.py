"""The library is usable without Flower: no fedbayes_flwr module but the codec imports flwr."""

import pkgutil
import subprocess
import sys

import pytest

import fedbayes_flwr

MODULES = sorted(m.name.removeprefix("fedbayes_flwr.")
                 for m in pkgutil.walk_packages(fedbayes_flwr.__path__, "fedbayes_flwr."))


def test_module_list_is_complete():
    assert {"codec", "runtime.config", "data", "runtime.experiment", "inference.gaussian", "models",
            "runtime.engine", "runtime.recorder", "algorithms.pvi", "algorithms.pvi.bundle",
            "algorithms.registry", "algorithms.base"} <= set(MODULES)


@pytest.mark.parametrize("module", [m for m in MODULES if m != "codec"])
def test_library_module_does_not_import_flwr(module):
    code = (f"import sys, fedbayes_flwr.{module}; "
            "leaked = sorted(m for m in sys.modules if m == 'flwr' or m.startswith('flwr.')); "
            "print(leaked); sys.exit(1 if leaked else 0)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"fedbayes_flwr.{module} imported {proc.stdout.strip()}"


def test_codec_is_the_flower_boundary():
    code = "import sys, fedbayes_flwr.codec; sys.exit(0 if 'flwr' in sys.modules else 1)"
    assert subprocess.run([sys.executable, "-c", code], timeout=120).returncode == 0
