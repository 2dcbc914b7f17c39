"""
Everything is in setup.cfg but one build step: the web console's code editor
(CodeMirror 6, ``trapsandbox/web/console/editor/``) is bundled from npm
packages into ``trapsandbox/web/console/editor.js`` by esbuild, so the wheel
ships one file and the page loads nothing from elsewhere.  ``make`` runs the
same two commands (``npm ci``, ``npm run build``); both need ``npm`` (Node 18
or later).
"""

import shutil
import subprocess
from pathlib import Path

from setuptools import Command, setup
from setuptools.command.build_py import build_py

EDITOR = Path(__file__).resolve().parent / "trapsandbox" / "web" / "console" / "editor"
BUNDLE = EDITOR.parent / "editor.js"


class build_console_editor(Command):
    description = "bundle the console's editor (npm ci, then esbuild)"
    user_options = []

    def initialize_options(self):
        pass

    def finalize_options(self):
        pass

    def run(self):
        npm = shutil.which("npm")
        if npm is None:
            raise SystemExit("building the console's editor needs npm (Debian: apt install npm)")
        quiet = ["--no-audit", "--no-fund", "--loglevel=error"]
        subprocess.run([npm, "ci", *quiet], cwd=EDITOR, check=True)
        # The esbuild command line is package.json's "build" script.
        subprocess.run([npm, "run", "--silent", "build"], cwd=EDITOR, check=True)


class build_py_with_editor(build_py):
    def run(self):
        if not BUNDLE.exists():
            self.run_command("build_console_editor")
        super().run()


setup(cmdclass={"build_console_editor": build_console_editor, "build_py": build_py_with_editor})
