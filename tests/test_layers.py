"""The import direction between autotune's packages: each imports only the packages below it in the layer
order of docs/layout.md, at module level, inside a function and under TYPE_CHECKING alike; inside study/,
the loop may import the trust room and never the reverse.

It reads the source with `ast` (scripts/import_layers.py, which also draws the whole graph); nothing is
imported and no process starts.
"""

from __future__ import annotations

import functools
import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def _import_layers() -> ModuleType:
    """scripts/import_layers.py as a module (scripts/ is not a package)."""
    spec = importlib.util.spec_from_file_location("import_layers", ROOT / "scripts" / "import_layers.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("import_layers", module)  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


layers = _import_layers()


@functools.cache
def imports() -> list[Any]:
    """The import graph, read once for this module's tests (the source does not change under them)."""
    return layers.imports()


def test_every_package_has_a_place_in_the_layer_order() -> None:
    order = layers.layer_order()
    packages = {layers.package_of(m) for m in layers.modules()} - {layers.PACKAGE}
    missing = sorted(packages - set(order))
    assert not missing, f"docs/layout.md: add {missing} to the line 'Layers, lowest first: ...'"
    assert len(order) == len(set(order)), f"docs/layout.md: a package stands twice in {order}"


def test_no_import_goes_up_the_layer_order() -> None:
    order = layers.layer_order()
    wrong = layers.against_order(imports(), order)
    lines = [
        f"{i.importer} imports {i.imported} (line {i.line}, {i.where.replace('_', ' ')}):"
        f" {layers.package_of(i.importer)} is below {layers.package_of(i.imported)}"
        for i in wrong
    ]
    assert not lines, (
        f"imports against the layer order {' < '.join(order)} (docs/layout.md); move the shared code to"
        " the lower package, or hand it in from above (the CLI joins the layers):\n" + "\n".join(lines)
    )


def test_study_s_ground_names_modules_that_exist() -> None:
    order, ground = layers.study_rooms()
    assert order == ["ground", "trust", "loop"], f"docs/layout.md: the rooms of study are {order}"
    known = set(layers.modules())
    missing = [name for name in ground if f"{layers.STUDY}.{name}" not in known]
    assert not missing, f"docs/layout.md: the study's ground names {missing}, which are no modules of study/"


def test_no_import_goes_up_the_rooms_of_study() -> None:
    order, ground = layers.study_rooms()
    wrong = layers.against_rooms(imports(), order, ground)
    lines = [
        f"{i.importer} imports {i.imported} (line {i.line}): "
        f"{layers.room_of(i.importer, ground)} is below {layers.room_of(i.imported, ground)}"
        for i in wrong
    ]
    assert not lines, (
        f"imports against the rooms of study {' < '.join(order)} (docs/layout.md): the trust room answers"
        " questions the loop asks, it never drives; move the shared code to the ground:\n" + "\n".join(lines)
    )


def test_the_rooms_of_study_are_read_from_the_code() -> None:
    _, ground = layers.study_rooms()
    assert layers.room_of("autotune.study.trust.noise", ground) == "trust"
    assert layers.room_of("autotune.study.trust", ground) == "trust"
    assert layers.room_of("autotune.study.records", ground) == "ground"
    assert layers.room_of("autotune.study.loop", ground) == "loop"
    assert layers.room_of("autotune.cli", ground) is None
    found = {(i.importer, i.imported) for i in imports()}
    # One arrow of each kind the rule allows, so that it cannot pass by reading nothing.
    assert ("autotune.study.loop", "autotune.study.trust.node_budget") in found
    assert ("autotune.study.trust.noise", "autotune.study.records") in found


def test_the_graph_reads_imports_at_module_level_in_functions_and_for_type_checks() -> None:
    found = {(i.importer, i.imported, i.where) for i in imports()}
    # Each kind seen on a known module, so that the rule above cannot pass by reading nothing.
    assert ("autotune.cli", "autotune.errors", "module") in found
    assert any(where == "function" for _, _, where in found)
    assert any(where == "type_checking" for _, _, where in found)
