"""What an installed gateway needs: every package of the tree listed in setup.cfg."""

import configparser
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
