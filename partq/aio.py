"""``partq.aio``: the ``partq.connect`` client for asyncio (``partq.remote.aio``).

    client = await partq.aio.connect("10.0.0.5:7020", token=token)
    flow = await client.bind("orders", name="svc-a")
    async for msg in flow:
        await flow.ack(msg)
"""
from partq.remote.aio import AsyncClient, AsyncFlow, connect

__all__ = ["AsyncClient", "AsyncFlow", "connect"]
