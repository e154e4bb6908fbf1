"""The layout is the architecture (README, Layout): each layer imports only from the ones
below it, no module imports another in a cycle (lazy imports included), no module takes
another's private helpers, and the leaf packages never import ``vrl``."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# Lower rank, lower layer. vrl/__init__.py is the public face, so it sits on top; so do the
# harness, which drives the node, and the audit. The CLI is above them all: it runs the harness
# (vrl devnet) and the audit, and nothing imports it back (what both need, such as logging's
# set-up, lives below: vrl.logs).
TOP = 5
LAYERS = {"vrl.errors": 0, "vrl.config": 0, "vrl.logs": 0, "vrl.tasks": 1, "vrl.rollouts": 2, "vrl.rl": 3, "vrl.zk": 3,
          "vrl.node": 4, "vrl.harness": TOP, "vrl.cli": TOP + 1}
HARNESS = "vrl.harness"
# The production modules that may import the harness (see test_production_code_never_imports_the_harness).
HARNESS_IMPORTERS = ("vrl.cli",)


def within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer(module: str) -> int:
    for prefix, rank in LAYERS.items():
        if module == prefix or module.startswith(prefix + "."):
            return rank
    return TOP


def imports(path: Path) -> list[tuple[str, list[str], int]]:
    """``(module, names, line)`` for every import in the file, at any depth (lazy ones and
    ``if TYPE_CHECKING:`` ones too), a relative one (``from .driver import x``) by its
    absolute name."""
    found = []
    package = module_name(path).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(alias.name, [], node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package[:len(package) - node.level + 1] if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            if module:
                found.append((module, [alias.name for alias in node.names], node.lineno))
    return found


def sources(package: str) -> list[Path]:
    return sorted((ROOT / package).rglob("*.py"))


def vrl_graph() -> dict[str, set[str]]:
    """Module -> the vrl modules it imports (``from vrl.x import y`` names module vrl.x.y
    when that is a module, since that is what gets imported)."""
    known = {module_name(p) for p in sources("vrl")}
    graph: dict[str, set[str]] = {}
    for path in sources("vrl"):
        targets = set()
        for module, names, _ in imports(path):
            if module == "vrl" or module.startswith("vrl."):
                submodules = {f"{module}.{n}" for n in names} & known
                targets |= submodules or {module}
        graph[module_name(path)] = targets - {module_name(path)}
    return graph


def upward_imports() -> list[str]:
    """``module:line imports target (names)`` for each import of a higher layer."""
    wrong = []
    for path in sources("vrl"):
        here = module_name(path)
        for module, names, line in imports(path):
            if (module == "vrl" or module.startswith("vrl.")) and layer(module) > layer(here):
                wrong.append(f"{here}:{line} imports {module} ({', '.join(names)})")
    return wrong


def test_each_layer_imports_only_from_the_layers_below():
    assert upward_imports() == []


def test_no_import_cycle():
    graph = vrl_graph()
    # A package imports its own submodules (its face); that is not a cycle through them.
    edges = {m: {t for t in ts if not (t.startswith(m + ".") and path_is_package(m))} for m, ts in graph.items()}
    state: dict[str, int] = {}
    cycles = []

    def visit(module: str, trail: list[str]) -> None:
        state[module] = 1
        for target in sorted(edges.get(module, ())):
            if state.get(target) == 1:
                cycles.append(" -> ".join(trail[trail.index(target):] + [module, target]) if target in trail
                              else f"{module} -> {target}")
            elif target in edges and not state.get(target):
                visit(target, trail + [module])
        state[module] = 2

    for module in sorted(edges):
        if not state.get(module):
            visit(module, [])
    assert cycles == []


def path_is_package(module: str) -> bool:
    return (ROOT / module.replace(".", "/") / "__init__.py").exists()


def test_no_private_helper_is_imported_across_modules():
    """A ``_name`` belongs to its module; a package's private module (``p2p._common``) may be
    shared by that package's own modules, and no one else's."""
    def allowed(importer: str, module: str, name: str) -> bool:
        package_private_module = (ROOT / module.replace(".", "/") / f"{name}.py").exists()
        return package_private_module and importer.rsplit(".", 1)[0] == module

    wrong = [f"{module_name(path)}:{line} takes {name} from {module}"
             for package in ("vrl", "proofs", "p2p") for path in sources(package)
             for module, names, line in imports(path) for name in names
             if name.startswith("_") and not name.startswith("__") and module.split(".")[0] in ("vrl", "proofs", "p2p")
             and module != module_name(path) and not allowed(module_name(path), module, name)]
    assert wrong == []


def test_the_leaf_packages_never_import_vrl():
    wrong = [f"{module_name(path)}:{line} imports {module}" for package in ("proofs", "p2p")
             for path in sources(package) for module, _, line in imports(path)
             if module == "vrl" or module.startswith("vrl.")]
    assert wrong == []


def production_imports_of_the_harness() -> list[str]:
    """``module:line imports vrl.harness...`` for each import of the harness from outside it
    and outside :data:`HARNESS_IMPORTERS`."""
    wrong = []
    for path in sources("vrl"):
        here = module_name(path)
        if within(here, HARNESS) or any(within(here, allowed) for allowed in HARNESS_IMPORTERS):
            continue
        for module, names, line in imports(path):
            targets = [module] if within(module, HARNESS) else [f"{module}.{n}" for n in names if module == "vrl"]
            wrong += [f"{here}:{line} imports {target}" for target in targets if within(target, HARNESS)]
    return wrong


def test_production_code_never_imports_the_harness():
    """The harness (``vrl/harness/``: the cheats, devnets, the demo, the vectors) drives, attacks
    and demonstrates the node; no production module imports it, so a cheat's code cannot reach
    an honest node and the harness can change without touching what it tests.

    The one exception is the CLI, ``vrl.cli`` and any module under it: its harness commands are
    the harness's entry points. ``vrl devnet`` runs :mod:`vrl.harness.devnet`, and ``vrl node``
    has a node whose node.toml sets ``adversary`` built by :func:`vrl.harness.adversary.node_for`
    (and loads the harness only then). No other module is let in, not even by prefix (``vrl.client`` is not
    ``vrl.cli``)."""
    assert production_imports_of_the_harness() == []


def test_the_checks_see_the_violations_they_are_for(tmp_path, monkeypatch):
    """The rules above, run on a tree that breaks each: they must not pass vacuously."""
    import tests.test_layout as rules

    (tmp_path / "vrl" / "rollouts").mkdir(parents=True)
    (tmp_path / "vrl" / "rl").mkdir()
    (tmp_path / "proofs").mkdir()
    (tmp_path / "p2p").mkdir()
    for package in ("vrl", "vrl/rollouts", "vrl/rl", "proofs", "p2p"):
        (tmp_path / package / "__init__.py").write_text("")
    (tmp_path / "vrl" / "rollouts" / "model.py").write_text("def f():\n    from vrl.rl.base import g\n")
    (tmp_path / "vrl" / "rl" / "base.py").write_text("from vrl.rollouts.model import f, _helper\n")
    (tmp_path / "proofs" / "x.py").write_text("import vrl\n")
    # The harness imported by a production module, lazily, and by a module whose name merely
    # starts like the CLI's; the CLI (a package here) and the harness itself may import it.
    (tmp_path / "vrl" / "harness").mkdir()
    (tmp_path / "vrl" / "cli").mkdir()
    for package in ("vrl/harness", "vrl/cli"):
        (tmp_path / package / "__init__.py").write_text("")
    (tmp_path / "vrl" / "harness" / "adversary.py").write_text("from vrl.harness import devnet\n")
    (tmp_path / "vrl" / "harness" / "devnet.py").write_text("")
    (tmp_path / "vrl" / "cli" / "node.py").write_text("from vrl.harness.adversary import work_for\n")
    (tmp_path / "vrl" / "rl" / "cheat.py").write_text("def f():\n    import vrl.harness.adversary\n")
    (tmp_path / "vrl" / "client.py").write_text("from vrl import harness\n")
    # The harness taking a name from the CLI, which runs it (the demo once took two).
    (tmp_path / "vrl" / "harness" / "demo.py").write_text("from vrl.cli import verdict_table\n")
    monkeypatch.setattr(rules, "ROOT", tmp_path)
    for check in (rules.test_each_layer_imports_only_from_the_layers_below, rules.test_no_import_cycle,
                  rules.test_no_private_helper_is_imported_across_modules,
                  rules.test_the_leaf_packages_never_import_vrl, rules.test_production_code_never_imports_the_harness):
        try:
            check()
        except AssertionError:
            continue
        raise AssertionError(f"{check.__name__} passed a tree that breaks it")
    assert rules.upward_imports() == ["vrl.harness.demo:1 imports vrl.cli (verdict_table)",
                                      "vrl.rl.cheat:2 imports vrl.harness.adversary ()",
                                      "vrl.rollouts.model:2 imports vrl.rl.base (g)"]
    # Exactly the two violators: the CLI's and the harness's own imports are allowed.
    assert rules.production_imports_of_the_harness() == ["vrl.client:1 imports vrl.harness",
                                                        "vrl.rl.cheat:2 imports vrl.harness.adversary"]


# The rooms rule (issue 29; README, Layout): a module over this many lines holds more than one job.
MAX_LINES = 700


def files_over(limit: int, root: Path = ROOT) -> list[str]:
    return sorted(f"{path.relative_to(root)}: {n}" for path in (root / "vrl").rglob("*.py")
                  if (n := len(path.read_text(encoding="utf-8").splitlines())) > limit)


def test_no_file_in_vrl_is_over_700_lines(tmp_path: Path) -> None:
    assert files_over(MAX_LINES) == []
    (tmp_path / "vrl").mkdir()
    (tmp_path / "vrl" / "big.py").write_text("x = 1\n" * (MAX_LINES + 1))
    (tmp_path / "vrl" / "small.py").write_text("x = 1\n" * MAX_LINES)
    assert files_over(MAX_LINES, tmp_path) == ["vrl/big.py: 701"]  # the check can fail


def test_a_relative_import_is_followed_even_when_only_for_type_checking(tmp_path, monkeypatch):
    """``from .driver import SimNode`` under ``if TYPE_CHECKING:`` closes a cycle as any import
    does (the simulator's actions and driver once took each other's names so)."""
    import tests.test_layout as rules

    (tmp_path / "vrl" / "sim").mkdir(parents=True)
    for package in ("vrl", "vrl/sim"):
        (tmp_path / package / "__init__.py").write_text("")
    (tmp_path / "vrl" / "sim" / "driver.py").write_text("from .actions import Actions\n")
    (tmp_path / "vrl" / "sim" / "actions.py").write_text("import typing\nif typing.TYPE_CHECKING:\n"
                                                       "    from . import driver\n")
    monkeypatch.setattr(rules, "ROOT", tmp_path)
    assert rules.vrl_graph() == {"vrl": set(), "vrl.sim": set(), "vrl.sim.driver": {"vrl.sim.actions"},
                                 "vrl.sim.actions": {"vrl.sim.driver"}}
    with pytest.raises(AssertionError):
        rules.test_no_import_cycle()
