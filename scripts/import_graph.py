"""The project's import graph: circles, floors and roof, and the layers picture.

    python scripts/import_graph.py                  # summary: modules, circles, largest module
    python scripts/import_graph.py --check          # exit 1 on a circle, an unclassified module
                                                    #   or a floor importing the roof (make lint)
    python scripts/import_graph.py --svg docs/layers.svg   # the picture (make docs)

The graph is grimp's (the one lint-imports checks), imports inside functions included, over the
five root packages without migrations and tests. A module is a *floor* when a contract of
pyproject.toml's [tool.importlinter] names it or a package above it (the layers contract's
tails, the core contract's sources); it is *roof* when it is an entry point (:func:`is_roof`).
A circle is a strongly connected component of more than one module (Tarjan, iterative).
--check also refuses product code importing test support and imports of another app's bare
package (``import retrieval``, whose attribute use the contracts cannot see).
"""

from __future__ import annotations

import argparse
import re
import sys
import tomllib
from collections import Counter
from html import escape
from pathlib import Path

import grimp

ROOT = Path(__file__).resolve().parent.parent
APPS = ["knowledgefs", "spaces", "ingestion", "retrieval", "upgrades"]  # bottom to top
# The roof: each app's entry points (a module or package of these names directly under the app,
# or under one of its packages, e.g. retrieval.research_tasks.admin), and knowledgefs' own.
ENTRY_POINTS = {"api", "admin", "cli", "tasks", "urls", "apps"}
CORE_ROOF = {
    "knowledgefs.urls",
    "knowledgefs.openapi",
    "knowledgefs.management",
    "knowledgefs.health",
    "knowledgefs.wsgi",
    "knowledgefs.internal",
    "knowledgefs.cli",
}
# upgrades.reconciliation_tasks: the dotted path stored django-q2 rows and messages name.
EXTRA_ROOF = {"upgrades.reconciliation_tasks"}  # fmt: skip
SKIP = (".migrations", ".tests", ".testing")


def build() -> tuple[dict[str, set[str]], grimp.ImportGraph]:
    """Return {module: modules it imports} over the project, and grimp's graph."""
    sys.path.insert(0, str(ROOT))
    graph = grimp.build_graph(*APPS, cache_dir=None)
    modules = {m for m in graph.modules if not is_test(m)}
    edges = {m: set(graph.find_modules_directly_imported_by(m)) for m in modules}
    return edges, graph


def is_test(module: str) -> bool:
    """Migrations, tests and test support (``<app>.tests``, ``knowledgefs.testing``)."""
    return any(s in module + "." for s in SKIP)


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (iterative Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root] & edges.keys())))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges[child] & edges.keys()))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def floors() -> list[str]:
    """Module names the contracts of pyproject.toml bind (layers tails and core sources)."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    names: list[str] = []
    for contract in config["contracts"]:
        for layer in contract.get("layers", []):
            names += [t.strip().strip("()") for t in re.split(r"[:|]", layer)]
        names += contract.get("source_modules", []) if contract["type"] == "forbidden" else []
    return names


def is_roof(module: str) -> bool:
    """An entry point: see ENTRY_POINTS, CORE_ROOF and EXTRA_ROOF."""
    parts = module.split(".")
    prefixes = {".".join(parts[:n]) for n in range(2, len(parts) + 1)}
    if prefixes & (CORE_ROOF | EXTRA_ROOF):
        return True
    # knowledgefs' api.py, admin.py and apps.py are core: base views, admin mixins, checks.
    return parts[0] != "knowledgefs" and any(p in ENTRY_POINTS for p in parts[1:])


def classify(module: str, floor_names: list[str]) -> str:
    """'roof', 'floor', 'package' (an app's own __init__) or 'unclassified'."""
    if is_roof(module):
        return "roof"
    if module in APPS:
        return "package"
    if any(module == f or module.startswith(f + ".") for f in floor_names):
        return "floor"
    return "unclassified"


def problems(edges: dict[str, set[str]]) -> list[str]:
    """Everything --check refuses, one line each (empty: the layers hold)."""
    names = floors()
    product = {m: {d for d in deps if d in edges} for m, deps in edges.items()}
    found = [f"circle of {len(c)}: {' '.join(c)}" for c in circles(product)]
    kinds = {m: classify(m, names) for m in product}
    found += [f"unclassified (name it in a contract or the roof): {m}"
              for m, kind in sorted(kinds.items()) if kind == "unclassified"]  # fmt: skip
    found += [f"floor imports the roof: {m} -> {d}"
              for m in sorted(product) if kinds[m] == "floor"
              for d in sorted(product[m]) if kinds[d] == "roof"]  # fmt: skip
    found += [f"product code imports test support: {m} -> {d}"
              for m in sorted(edges) for d in sorted(edges[m]) if is_test(d)]  # fmt: skip
    # `import retrieval` then `retrieval.modes.x` hides the module from the contracts.
    found += [f"imports another app's bare package (name the module): {m} -> {d}"
              for m in sorted(product) for d in sorted(product[m])
              if d in APPS and d != m.split(".")[0]]  # fmt: skip
    return found


def largest_modules(count: int = 5) -> list[tuple[int, str]]:
    sizes = []
    for app in APPS:
        for path in (ROOT / app).rglob("*.py"):
            rel = path.relative_to(ROOT).as_posix()
            if "/migrations/" in rel or "/tests/" in rel or "/testing/" in rel:
                continue
            sizes.append((len(path.read_text().splitlines()), rel))
    return sorted(sizes, reverse=True)[:count]


def app_edges(edges: dict[str, set[str]]) -> tuple[Counter, Counter]:
    """(floor -> floor, roof -> floor) import counts between apps, app level."""
    floor_edges: Counter = Counter()
    roof_edges: Counter = Counter()
    for module, imported in edges.items():
        for dep in imported:
            a, b = module.split(".")[0], dep.split(".")[0]
            if a == b:
                continue
            (roof_edges if is_roof(module) else floor_edges)[(a, b)] += 1
    return floor_edges, roof_edges


def svg(edges: dict[str, set[str]]) -> str:
    """The layers as an SVG: one box per app, bottom to top, with the floor->floor import
    counts between apps on the arrows and the roof's count beside it."""
    floor_edges, roof_edges = app_edges(edges)
    modules = Counter(m.split(".")[0] for m in edges if not is_roof(m))
    roof_modules = Counter(m.split(".")[0] for m in edges if is_roof(m))
    width, box_w, box_h, gap = 920, 320, 54, 46
    height = 80 + (len(APPS) + 1) * (box_h + gap)
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'font-family="sans-serif" font-size="13">',
        '<defs><marker id="a" markerWidth="10" markerHeight="8" refX="9" refY="4" '
        'orient="auto"><path d="M0,0 L10,4 L0,8 z" fill="#555"/></marker></defs>',
        f'<text x="20" y="28" font-size="16" font-weight="bold">KnowledgeFS layers '
        f"(generated by scripts/import_graph.py; {len(circles(edges))} import circles)</text>",
    ]
    y_of = {}
    order = ["roof", *reversed(APPS)]
    for row, name in enumerate(order):
        y = 50 + row * (box_h + gap)
        y_of[name] = y
        x = 40
        fill = "#f3e8c8" if name == "roof" else "#dbe8f6"
        label = (
            "roof: urls, openapi, kfs, health; each app's api, admin, cli, tasks"
            if name == "roof"
            else f"{name}" + (" core" if name == "knowledgefs" else "")
        )
        detail = (f"{sum(roof_modules.values())} modules, may import any app"
                  if name == "roof" else f"{modules[name]} floor modules, "
                  f"{roof_modules[name]} roof modules")  # fmt: skip
        out.append(f'<rect x="{x}" y="{y}" width="{box_w + 160}" height="{box_h}" rx="6" '
                   f'fill="{fill}" stroke="#345"/>')  # fmt: skip
        out.append(f'<text x="{x + 12}" y="{y + 22}" font-weight="bold">{escape(label)}</text>')
        out.append(f'<text x="{x + 12}" y="{y + 42}" fill="#333">{escape(detail)}</text>')
    for row in range(len(order) - 1):
        upper, lower = order[row], order[row + 1]
        y1 = y_of[upper] + box_h
        y2 = y_of[lower]
        out.append(f'<line x1="200" y1="{y1}" x2="200" y2="{y2 - 2}" stroke="#555" '
                   f'marker-end="url(#a)"/>')  # fmt: skip
    for upper in reversed(APPS):
        below = [f"{b} {n}" for (a, b), n in sorted(floor_edges.items()) if a == upper]
        if not below:
            continue
        x, y = 40 + box_w + 180, y_of[upper] + 22
        out.append(f'<text x="{x}" y="{y}" fill="#333" font-size="12">imports into the floors '
                   f"below (module pairs):</text>")  # fmt: skip
        out.append(f'<text x="{x}" y="{y + 18}" fill="#333" font-size="12">'
                   f"{escape(', '.join(below))}</text>")  # fmt: skip
    upward = sum(n for (a, b), n in floor_edges.items() if APPS.index(b) > APPS.index(a))
    out.append(f'<text x="20" y="{height - 14}" fill="#333">floor imports pointing up: {upward}; '
               f'roof imports into the apps: {sum(roof_edges.values())}</text>')  # fmt: skip
    out.append("</svg>")
    return "\n".join(out) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true")
    parser.add_argument("--svg", type=Path)
    args = parser.parse_args()
    edges, _ = build()
    if args.svg:
        args.svg.write_text(svg(edges))
    found = problems(edges)
    in_circles = sum(len(c) for c in circles(edges))
    print(f"{len(edges)} modules; {in_circles} in import circles")
    for lines, path in largest_modules(3):
        print(f"  {lines:5d}  {path}")
    for problem in found:
        print(problem)
    return 1 if (args.check and found) else 0


if __name__ == "__main__":
    sys.exit(main())
