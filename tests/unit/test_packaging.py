"""What an installed gateway needs: every package of the tree listed in setup.cfg, and every
library it imports declared there (and nothing declared that it does not import)."""

import ast
import configparser
import importlib.metadata
import re
import sys
from pathlib import Path

from twisted.trial.unittest import SynchronousTestCase

REPO = Path(__file__).resolve().parents[2]


class PackagingTests(SynchronousTestCase):
    def test_every_package_of_the_tree_is_installed(self):
        setup = configparser.ConfigParser()
        setup.read(REPO / "setup.cfg")
        listed = set(setup["options"]["packages"].split())
        found = {
            ".".join(init.parent.relative_to(REPO).parts)
            for init in (REPO / "trapsandbox").rglob("__init__.py")
        }
        self.assertEqual(found - listed, set())
        self.assertIn("twisted.plugins", listed)

    def test_what_the_code_imports_is_what_setup_cfg_declares(self):
        setup = configparser.ConfigParser()
        setup.read(REPO / "setup.cfg")

        def names(text: str) -> set[str]:
            return {
                re.split(r"[\s\[<>=!~;]", line.strip(), maxsplit=1)[0].lower().replace("_", "-")
                for line in text.splitlines()
                if line.strip() and not line.strip().startswith("#")
            }

        required = names(setup["options"]["install_requires"])
        cluster = names(setup["options.extras_require"]["cluster"])
        sources = [
            *(REPO / "trapsandbox").rglob("*.py"),
            REPO / "twisted/plugins/trapsandbox_plugin.py",
        ]
        modules = set()
        for source in sources:
            for node in ast.walk(ast.parse(source.read_text())):
                if isinstance(node, ast.Import):
                    modules.update(alias.name.split(".")[0] for alias in node.names)
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    modules.add(node.module.split(".")[0])
        distributions = importlib.metadata.packages_distributions()
        imported = set()
        for module in modules - set(sys.stdlib_module_names) - {"trapsandbox", "twisted"}:
            imported.update(d.lower().replace("_", "-") for d in distributions[module])
        imported.add("twisted")
        self.assertEqual(imported - required - cluster, set(), "imported but not declared")
        self.assertEqual(required - imported, set(), "declared but not imported")
        self.assertEqual(cluster, {"txredisapi"})

    def test_each_package_map_names_each_of_its_modules(self):
        # A package's __init__ is the map of its modules (``name``, one line or more each).
        for init in (REPO / "trapsandbox").rglob("__init__.py"):
            doc = init.read_text()
            modules = {p.stem for p in init.parent.glob("*.py")} - {"__init__"}
            missing = sorted(m for m in modules if f"``{m}``" not in doc)
            self.assertEqual(missing, [], f"{init.relative_to(REPO)} does not name them")

    def test_each_part_imports_only_the_parts_above_it_in_the_map(self):
        # trapsandbox/__init__ lists its modules and packages in layers: each may import
        # (even only for types) those listed above it, never one below.
        doc = (REPO / "trapsandbox/__init__.py").read_text()
        order = re.findall(r"^    ``(\w+)``", doc, re.M)
        parts = {p.stem for p in (REPO / "trapsandbox").glob("*.py")} - {"__init__"}
        parts |= {p.parent.name for p in (REPO / "trapsandbox").glob("*/__init__.py")}
        self.assertEqual(sorted(order), sorted(parts), "the map names each part once")
        rank = {name: n for n, name in enumerate(order)}
        upward = []
        for source in (REPO / "trapsandbox").rglob("*.py"):
            relative = source.relative_to(REPO / "trapsandbox").parts
            part = relative[0].removesuffix(".py")
            for node in ast.walk(ast.parse(source.read_text())):
                names = []
                if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
                    "trapsandbox"
                ):
                    path = node.module.split(".")
                    names = [path[1]] if len(path) > 1 else [a.name for a in node.names]
                elif isinstance(node, ast.Import):
                    names = [
                        a.name.split(".")[1]
                        for a in node.names
                        if a.name.startswith("trapsandbox.")
                    ]
                for name in names:
                    if name in rank and rank[name] > rank[part]:
                        upward.append(f"{'/'.join(relative)} imports {name}")
        self.assertEqual(upward, [])
