"""The layers hold: config and losses at the bottom, then data, models, train and evaluate, methods, the
runners and the CLI on top (the import-linter contract in pyproject.toml), and no module imports itself back."""

import shutil
import subprocess
import sys
from pathlib import Path

import grimp

ROOT = Path(__file__).resolve().parents[1]


def test_layers_import_downward_only():
    lint = shutil.which("lint-imports", path=str(Path(sys.executable).parent)) or shutil.which("lint-imports")
    result = subprocess.run([lint, "--no-cache", str(ROOT / "pyproject.toml")], capture_output=True, text=True,
                            cwd=ROOT, timeout=300)
    assert result.returncode == 0, result.stdout[result.stdout.find("Broken contracts"):] + result.stderr
    assert "1 kept, 0 broken" in result.stdout


def test_no_import_cycle():
    """Function-local imports count too: a cycle hidden inside a function is still a cycle."""
    graph = grimp.build_graph("distilkit")
    cycles = {" -> ".join((module, *graph.find_shortest_chain(importer=imported, imported=module)))
              for module in graph.modules for imported in graph.find_modules_directly_imported_by(module)
              if graph.find_shortest_chain(importer=imported, imported=module)}
    assert not cycles, "import cycles:\n" + "\n".join(sorted(cycles))
