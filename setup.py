"""The package list, found from the folder layout so that a new subpackage is never left out.

The library is one import namespace, ``partq``, laid over four top-level folders: ``partq/`` is
``partq`` itself and ``storage/``, ``tools/``, ``spark/`` are ``partq.storage``, ``partq.tools``
and ``partq.spark``. setuptools' own discovery reads one folder as one root, so it cannot name
packages of such a layout; this file walks each root and names every folder with an
``__init__.py`` under it. Everything else about the distribution is in pyproject.toml.
"""
from setuptools import find_packages, setup

ROOTS = {"partq": "partq", "partq.storage": "storage", "partq.tools": "tools", "partq.spark": "spark"}


def packages() -> list[str]:
    found = []
    for name, folder in ROOTS.items():
        found.append(name)
        found.extend(f"{name}.{sub}" for sub in find_packages(folder))
    return sorted(found)


setup(package_dir=ROOTS, packages=packages())
