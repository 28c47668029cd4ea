"""The import graph of autotune's packages, read from the source with `ast` (nothing is imported).

Prints the packages, their floors (a package's floor is one above the highest floor it imports; cycles
share a floor), the arrows between packages, the arrows that run back up against the layer order of
docs/layout.md, the cycles, and the imports made inside functions (total and across packages).

    python scripts/import_layers.py            # the report
    python scripts/import_layers.py --arrows   # also every module-to-module import across packages
"""

from __future__ import annotations

import argparse
import ast
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "autotune"
# docs/layout.md states the order once, in a line of this shape.
LAYOUT = Path("docs") / "layout.md"
ORDER_LINE = re.compile(r"^Layers, lowest first: (.+)$", re.MULTILINE)
# And the rooms inside study/: the ground (modules it lists), the trust subpackage, the loop (the rest).
ROOMS_LINE = re.compile(r"^Rooms of study, lowest first: (.+)$", re.MULTILINE)
GROUND_LINE = re.compile(r"^The study's ground: (.+)$", re.MULTILINE)
STUDY = f"{PACKAGE}.study"


@dataclass(frozen=True)
class Import:
    """One import statement of an autotune module that names another autotune module."""

    importer: str  # the module holding the statement, e.g. autotune.study.loop
    imported: str  # the autotune module it loads, e.g. autotune.tracking.tracker
    line: int
    where: str  # "module", "function" (inside a def) or "type_checking" (under `if TYPE_CHECKING:`)


def modules(root: Path = ROOT) -> dict[str, Path]:
    """Every module of the package by dotted name (a package by its name, its file __init__.py)."""
    found = {}
    for path in sorted((root / PACKAGE).rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def package_of(module: str) -> str:
    """The layer a module belongs to: autotune's subpackage, or the top-level module itself (cli, errors);
    `python -m autotune` (__main__) is the command line's."""
    parts = module.split(".")
    name = parts[1] if len(parts) > 1 else PACKAGE
    return "cli" if name == "__main__" else name


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _statements(tree: ast.AST, where: str = "module") -> Iterator[tuple[ast.Import | ast.ImportFrom, str]]:
    """Every import statement under `tree`, with where it runs."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node, where
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            yield from _statements(node, "function")
        elif isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.body:
                yield from _statements(ast.Module(body=[child], type_ignores=[]), "type_checking")
            for child in node.orelse:
                yield from _statements(ast.Module(body=[child], type_ignores=[]), where)
        else:
            yield from _statements(node, where)


def _resolve(name: str, known: dict[str, Path]) -> str | None:
    """The longest known module that `name` is or lies in (an imported function lies in its module)."""
    while name:
        if name in known:
            return name
        name = name.rpartition(".")[0]
    return None


def imports(root: Path = ROOT) -> list[Import]:
    """Every import of one autotune module by another, module level, in functions and for type checks."""
    known = modules(root)
    found = []
    for module, path in known.items():
        tree = ast.parse(path.read_text(), str(path))
        is_package = path.name == "__init__.py"
        for node, where in _statements(tree):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                base = node.module or ""
                if node.level:  # relative: from the module's package, one level up per extra dot
                    anchor = module.split(".")[: None if is_package else -1]
                    anchor = anchor[: len(anchor) - (node.level - 1)]
                    base = ".".join([*anchor, base] if base else anchor)
                targets = [f"{base}.{alias.name}" for alias in node.names]
            for target in targets:
                resolved = _resolve(target, known) if target.split(".")[0] == PACKAGE else None
                if resolved and resolved != module:
                    found.append(Import(module, resolved, node.lineno, where))
    return list(dict.fromkeys(found))  # one per statement and module, however many names it takes


def statements_in_functions(root: Path = ROOT) -> int:
    """How many import statements of any library run inside a function."""
    return sum(
        where == "function"
        for path in modules(root).values()
        for _, where in _statements(ast.parse(path.read_text(), str(path)))
    )


def layer_order(page: Path = ROOT / LAYOUT) -> list[str]:
    """The packages lowest first, as docs/layout.md writes them."""
    match = ORDER_LINE.search(page.read_text())
    if match is None:
        raise SystemExit(f"{page}: no line 'Layers, lowest first: a < b < ...'")
    return [name.strip().strip("`") for name in match.group(1).split("<")]


def against_order(found: list[Import], order: list[str]) -> list[Import]:
    """The imports whose imported package is not below the importer's package in `order`."""
    rank = {name: i for i, name in enumerate(order)}
    wrong = []
    for imp in found:
        low, high = package_of(imp.imported), package_of(imp.importer)
        if low != high and rank.get(low, len(order)) >= rank.get(high, len(order)):
            wrong.append(imp)
    return wrong


def study_rooms(page: Path = ROOT / LAYOUT) -> tuple[list[str], list[str]]:
    """The rooms of study lowest first, and the modules of its ground, as docs/layout.md writes them."""
    text = page.read_text()
    rooms, ground = ROOMS_LINE.search(text), GROUND_LINE.search(text)
    if rooms is None or ground is None:
        raise SystemExit(f"{page}: no line 'Rooms of study, lowest first: ...' and 'The study's ground: ...'")
    order = [name.strip().strip("`") for name in rooms.group(1).split("<")]
    return order, [name.strip().strip("`") for name in ground.group(1).split(",")]


def room_of(module: str, ground: list[str]) -> str | None:
    """The room of study/ a module stands in: a folder of study/ (trust), the ground, or the loop (the
    rest); None outside study/."""
    if module != STUDY and not module.startswith(STUDY + "."):
        return None
    parts = module.split(".")[2:]
    if not parts:
        return "loop"  # study/__init__.py
    if len(parts) > 1 or (ROOT / PACKAGE / "study" / parts[0]).is_dir():
        return parts[0]  # a folder of study/ is a room of its own
    return "ground" if parts[0] in ground else "loop"


def against_rooms(found: list[Import], order: list[str], ground: list[str]) -> list[Import]:
    """The imports inside study/ whose imported room is above the importer's in `order`."""
    rank = {name: i for i, name in enumerate(order)}
    wrong = []
    for imp in found:
        low, high = room_of(imp.imported, ground), room_of(imp.importer, ground)
        if low is None or high is None or low == high:
            continue
        if rank.get(low, len(order)) > rank.get(high, len(order)):
            wrong.append(imp)
    return wrong


def _cycles(arrows: set[tuple[str, str]]) -> list[list[str]]:
    """The elementary cycles of a small directed graph, each from its smallest node."""
    successors: dict[str, list[str]] = {}
    for a, b in sorted(arrows):
        successors.setdefault(a, []).append(b)
    found = []

    def walk(start: str, node: str, path: list[str]) -> None:
        for nxt in successors.get(node, []):
            if nxt == start:
                found.append([*path])
            elif nxt > start and nxt not in path:
                walk(start, nxt, [*path, nxt])

    for start in sorted(successors):
        walk(start, start, [start])
    return found


def _floors(packages: list[str], arrows: set[tuple[str, str]], cycles: list[list[str]]) -> dict[str, int]:
    """Floor 0 imports no other package; each package sits one above what it imports (a cycle: one floor)."""
    group = {p: p for p in packages}
    for cycle in cycles:  # merge each cycle's members into one group
        head = group[cycle[0]]
        for member in cycle:
            old = group[member]
            for p in packages:
                if group[p] == old:
                    group[p] = head
    floor: dict[str, int] = {}

    def of(g: str, seen: frozenset[str]) -> int:
        if g not in floor:
            below = {group[b] for a, b in arrows if group[a] == g and group[b] != g}
            floor[g] = 1 + max((of(b, seen | {g}) for b in below if b not in seen), default=-1)
        return floor[g]

    return {p: of(group[p], frozenset()) for p in packages}


def _groups(arrows: set[tuple[str, str]], cycles: list[list[str]]) -> list[set[str]]:
    """The packages that reach each other (a circle), merged from the elementary cycles."""
    groups: list[set[str]] = []
    for cycle in cycles:
        members = set(cycle)
        for group in [g for g in groups if g & members]:
            members |= group
            groups.remove(group)
        groups.append(members)
    return groups


def report(root: Path = ROOT, order: list[str] | None = None, show_arrows: bool = False) -> str:
    known = modules(root)
    found = imports(root)
    packages = sorted({package_of(m) for m in known})
    arrows = {(package_of(i.importer), package_of(i.imported)) for i in found}
    arrows = {(a, b) for a, b in arrows if a != b}
    cycles = _cycles(arrows)
    floors = _floors(packages, arrows, cycles)
    if order is None:
        try:
            order = layer_order(root / LAYOUT)
        except SystemExit as missing:
            order = []
            print(missing, file=sys.stderr)
    back_up = {(package_of(i.importer), package_of(i.imported)) for i in against_order(found, order)}
    in_functions = [i for i in found if i.where == "function"]
    across = [i for i in in_functions if package_of(i.importer) != package_of(i.imported)]
    lines = [f"{len(packages)} packages on {len(set(floors.values()))} floors, {len(arrows)} arrows"]
    for f in sorted(set(floors.values()), reverse=True):
        lines.append(f"  floor {f}: {' '.join(p for p in packages if floors[p] == f)}")
    lines.append("arrows (importer -> imported):")
    for a in packages:
        targets = sorted(b for x, b in arrows if x == a)
        if targets:
            lines.append(f"  {a} -> {', '.join(targets)}")
    lines.append(f"layer order: {' < '.join(order) if order else '(none in docs/layout.md)'}")
    lines.append(f"arrows back up against it: {len(back_up)}")
    lines += [f"  {a} -> {b}" for a, b in sorted(back_up)]
    groups = _groups(arrows, cycles)
    lines.append(f"circles: {len(groups)} groups of packages that import each other ({len(cycles)} cycles)")
    lines += [f"  {' '.join(sorted(g))}" for g in groups]
    lines += [f"    {' -> '.join([*c, c[0]])}" for c in cycles]
    lines.append(
        f"import statements inside functions: {statements_in_functions(root)} of any library;"
        f" of autotune's modules {len(in_functions)}, {len(across)} across packages"
    )
    lines += [f"  {i.importer}:{i.line} -> {i.imported}" for i in across]
    try:
        rooms, ground = study_rooms(root / LAYOUT)
    except SystemExit as missing:
        rooms, ground = [], []
        print(missing, file=sys.stderr)
    room_arrows: dict[tuple[str, str], int] = {}
    for i in found:
        a, b = room_of(i.importer, ground), room_of(i.imported, ground)
        if a is not None and b is not None and a != b:
            room_arrows[(a, b)] = room_arrows.get((a, b), 0) + 1
    lines.append(f"rooms of study: {' < '.join(rooms) if rooms else '(none in docs/layout.md)'}")
    lines += [f"  {a} -> {b}: {n} imports" for (a, b), n in sorted(room_arrows.items())]
    against = against_rooms(found, rooms, ground)
    lines.append(f"imports up the rooms of study: {len(against)}")
    lines += [f"  {i.importer}:{i.line} -> {i.imported}" for i in against]
    under_type_checking = [i for i in found if i.where == "type_checking"]
    lines.append(f"imports under TYPE_CHECKING: {len(under_type_checking)}")
    if show_arrows:
        lines.append("module imports across packages:")
        lines += [
            f"  {i.importer}:{i.line} -> {i.imported} ({i.where})"
            for i in found
            if package_of(i.importer) != package_of(i.imported)
        ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arrows", action="store_true", help="list every import across packages")
    parser.add_argument("--order", help="a layer order 'a<b<c' to check instead of docs/layout.md's")
    args = parser.parse_args()
    order = [name.strip() for name in args.order.split("<")] if args.order else None
    print(report(order=order, show_arrows=args.arrows))


if __name__ == "__main__":
    main()
