"""Names of a package that load on first use (PEP 562), so that importing a package, or one of
its modules, does not import every module the package re-exports: a command loads what it uses.

    __getattr__, __dir__ = lazy_names(__name__, {"Dispatcher": "dispatcher", ...})

maps each name to the submodule (relative to the package) that defines it. The package keeps
``from ... import X as X`` lines under ``if TYPE_CHECKING:`` for type checkers.
"""
import importlib
import sys
from collections.abc import Callable


def lazy_names(package: str, names: dict[str, str]) \
        -> tuple[Callable[[str], object], Callable[[], list[str]]]:
    """A module ``__getattr__`` that imports ``package.<names[name]>`` and returns its ``name``
    (kept in the package afterwards), and a ``__dir__`` listing the package's dunders and its
    ``__all__``."""
    def getattr_(name: str) -> object:
        where = names.get(name)
        if where is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{where}"), name)
        setattr(sys.modules[package], name, value)
        return value

    def dir_() -> list[str]:
        module = vars(sys.modules[package])
        return sorted({*(n for n in module if n.startswith("__")), *module.get("__all__", names)})

    return getattr_, dir_
