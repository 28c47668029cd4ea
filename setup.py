"""The wheel carries search_spaces/, objectives/ and examples/ (beside the package in a checkout) as
autotune/shipped/, where autotune.config.init finds them once installed; pyproject.toml holds the rest."""

from __future__ import annotations

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

SHIPPED = ("search_spaces", "objectives", "examples")


class BuildWithShippedFiles(build_py):
    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):
            return  # an editable install reads them from the checkout
        for name in SHIPPED:
            source = Path(name)
            target = Path(self.build_lib) / "autotune" / "shipped" / name
            shutil.rmtree(target, ignore_errors=True)  # a file removed since the last build goes too
            shutil.copytree(source, target, ignore=shutil.ignore_patterns(".*"))


setup(cmdclass={"build_py": BuildWithShippedFiles})
