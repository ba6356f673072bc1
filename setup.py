"""Puts the small tier into the package: a wheel (and an install from the sdist) carries
`conformance.yaml`, `goldens/` (with MANIFEST.json, and the production tier's pinned manifest) and
`cases/` under `harness/_store/`, where `v41_conformance.store` finds them. Everything else is in pyproject.toml.

The production tier's goldens (`goldens/production/<component>/`, built locally) never go in: the
package holds their pinned hashes, and `conformance generate --tier production` builds them into the
user cache. An editable install reads the same files from the checkout and copies nothing.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from setuptools import find_packages, setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent
PACKAGE = "v41_conformance"  # the import name; its source folder is SOURCE
SOURCE = "harness"
STORE = Path(PACKAGE) / "_store"


def store_files() -> list[tuple[Path, Path]]:
    """(source, destination under the store) of every file the package carries."""
    files = [HERE / "conformance.yaml"]
    for path in sorted((HERE / "goldens").rglob("*")):
        relative = path.relative_to(HERE / "goldens").parts
        built_production = relative[0] == "production" and len(relative) > 1 and relative[1] != "MANIFEST.json"
        if path.is_file() and not built_production and not path.name.startswith("."):
            files.append(path)
    files += [p for p in sorted((HERE / "cases").rglob("*.yaml")) if p.is_file()]
    return [(p, p.relative_to(HERE)) for p in files]


class BuildPyWithStore(build_py):
    def run(self):
        super().run()
        if getattr(self, "editable_mode", False):
            return  # the checkout is the store
        target = Path(self.build_lib) / STORE
        if target.exists():
            shutil.rmtree(target)
        for source, relative in store_files():
            destination = target / relative
            destination.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, destination)


setup(
    packages=[PACKAGE] + [f"{PACKAGE}.{sub}" for sub in find_packages(SOURCE)],
    package_dir={PACKAGE: SOURCE},
    package_data={PACKAGE: ["py.typed"]},  # PEP 561: the package's annotations are for its users' type checkers
    cmdclass={"build_py": BuildPyWithStore},
)
