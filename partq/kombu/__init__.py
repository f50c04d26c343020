"""partq as a kombu transport, so Celery (and any kombu program) runs on a partq directory or
on ``partq serve``::

    import partq.kombu                    # registers the transport "partq"
    app = Celery("tasks", broker="partq:///var/lib/app/queue")
    app = Celery("tasks", broker="partq://:TOKEN@10.0.0.5:7020")

Importing this module registers the alias ``partq`` in kombu's transport table; it imports kombu,
so ``pip install 'partq[celery]'`` first. docs/celery.md says what each kombu and Celery setting
becomes in partq.
"""
from __future__ import annotations

from kombu.transport import TRANSPORT_ALIASES

from partq.kombu.qos import QoS
from partq.kombu.transport import Channel, Transport

TRANSPORT_ALIASES.setdefault("partq", "partq.kombu:Transport")

__all__ = ["Channel", "QoS", "Transport"]
