"""The web console (``partq console``, ``partq serve --console-listen``): a page served by partq
itself over HTTP, and the JSON API the page and scripts share.

Rooms: ``server`` (the HTTP listener and its limits), ``access`` (who may read and act: loopback,
token, TLS, same-origin), ``routes`` (requests to views, actions and the page's files), ``views``
(the JSON of the overview, a queue, messages), ``history`` (rates and the last minutes of them),
``actions`` (what an operator may change with ``--allow-actions``, each logged), and ``static/``
(the page: plain HTML, one JavaScript file and one stylesheet, no build step).

The names below load on first use (``partq.lazy``)."""
from typing import TYPE_CHECKING

from partq.lazy import lazy_names

_NAMES = {"ConsoleServer": "server"}

__all__ = sorted(_NAMES)
__getattr__, __dir__ = lazy_names(__name__, _NAMES)

if TYPE_CHECKING:
    from partq.console.server import ConsoleServer as ConsoleServer
