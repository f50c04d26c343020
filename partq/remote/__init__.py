"""partq across hosts: ``partq serve`` (``server``) and its clients: ``partq.connect``
(``client``), the flow a client consumes over its connection (``endpoint``) and the same client
for asyncio (``aio``, public as ``partq.aio``)."""
