"""``crc32c(data, value=0)``: the checksum of every record, frame and snapshot, and the key hash
(rule `key-hash`), from the crc32c package's C extension alone.

The package's ``__init__`` looks its own version up through ``importlib.metadata`` when it is
imported, which costs a command some 20-70 ms at every start; the extension it wraps loads in
about 1 ms. So the extension module (``crc32c._crc32c``) is loaded here by itself, registered
under its own name (a later ``import crc32c`` reuses it). Where the installed package is laid out
otherwise, its public import is used: the same function either way.
"""
from __future__ import annotations

import importlib.machinery
import importlib.util
import sys
from collections.abc import Callable

EXTENSION = "crc32c._crc32c"


def _extension_crc32c() -> Callable[..., int]:
    loaded = sys.modules.get(EXTENSION) or sys.modules.get("crc32c")
    if loaded is not None:
        return loaded.crc32c
    package = importlib.machinery.PathFinder.find_spec("crc32c")
    where = package.submodule_search_locations if package is not None else None
    spec = importlib.machinery.PathFinder.find_spec(EXTENSION, where) if where else None
    if spec is None or not isinstance(spec.loader, importlib.machinery.ExtensionFileLoader):
        raise ImportError(f"no C extension {EXTENSION}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sys.modules[EXTENSION] = module
    return module.crc32c


def _load() -> Callable[..., int]:
    try:
        return _extension_crc32c()
    except (ImportError, AttributeError):
        import crc32c as package
        return package.crc32c


crc32c: Callable[..., int] = _load()
