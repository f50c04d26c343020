"""``partq.aio``: the ``partq.connect`` client for asyncio.

    client = await partq.aio.connect("10.0.0.5:7020", token=token)
    await client.publish("orders", b"payload", key="customer-42")
    flow = await client.bind("orders", name="svc-a")
    async for msg in flow:                  # receives in batches, waits without blocking the loop
        await flow.ack(msg)

Every call runs the synchronous client's call in a worker thread (``asyncio.to_thread``): the
event loop never blocks, and both clients share one implementation of the protocol, reconnects
and flow control.
"""
from __future__ import annotations

import asyncio
from collections.abc import Iterable

from partq.config import QueueConfig
from partq.flow import Flow, received
from partq.message import FlowChangeUpdate, Message, PublishResult
from partq.publish.encode import check_batch
from partq.remote import client as sync_client
from partq.remote.client_txn import ClientTransaction
from partq.status import QueueStatus


async def connect(address: str, token: str | bytes | None = None, ssl=None, *,
                  token_file: str | None = None, timeout: float = 10.0,
                  reconnect_timeout: float = sync_client.RECONNECT_TIMEOUT) -> AsyncClient:
    """``partq.connect`` for asyncio; the same arguments. ``async for msg in flow`` ends with
    ``FlowClosed`` once the client gave up reconnecting (``reconnect_timeout``, 300 s)."""
    return AsyncClient(await asyncio.to_thread(sync_client.connect, address, token, ssl,
                                               token_file=token_file, timeout=timeout,
                                               reconnect_timeout=reconnect_timeout))


class AsyncClient:
    def __init__(self, client: sync_client.Client) -> None:
        self.sync = client

    async def publish(self, queue: str, payload: bytes, key: str | None = None,
                      headers: dict | None = None) -> PublishResult:
        pending = self.sync.publish_async(queue, payload, key, headers)
        return await asyncio.to_thread(pending.result)

    async def publish_many(self, queue: str, items: Iterable) -> list[PublishResult]:
        check_batch(items)      # before list() takes a str or bytes apart
        return await asyncio.to_thread(self.sync.publish_many, queue, list(items))

    async def bind(self, queue: str, name: str | None = None, hint: Iterable[int] | None = None,
                   skip_corrupt: bool = False) -> AsyncFlow:
        return AsyncFlow(await asyncio.to_thread(self.sync.bind, queue, name, hint, skip_corrupt))

    def transaction(self) -> AsyncTransaction:
        """``async with client.transaction() as tx:``: ``Client.transaction``, committed at the
        block's end without blocking the event loop (its calls only buffer)."""
        return AsyncTransaction(self.sync.transaction())

    async def queue_status(self, queue: str) -> QueueStatus:
        return await asyncio.to_thread(self.sync.queue_status, queue)

    # the queue verbs of Broker (partq.remote.client_admin), in a worker thread each
    async def create_queue(self, name: str, partitions: int = 1, exist_ok: bool = False,
                           **options) -> QueueConfig:
        return await asyncio.to_thread(self.sync.create_queue, name, partitions, exist_ok,
                                       **options)

    async def update_queue(self, name: str, **changes) -> QueueConfig:
        return await asyncio.to_thread(self.sync.update_queue, name, **changes)

    async def delete_queue(self, name: str) -> None:
        await asyncio.to_thread(self.sync.delete_queue, name)

    async def queue_config(self, name: str) -> QueueConfig:
        return await asyncio.to_thread(self.sync.queue_config, name)

    async def queues(self) -> list[QueueConfig]:
        return await asyncio.to_thread(self.sync.queues)

    async def scale(self, name: str, partitions: int, progress=None, online: bool = False,
                    wait: bool = True) -> QueueConfig:
        return await asyncio.to_thread(self.sync.scale, name, partitions, progress, online, wait)

    async def kill_message(self, queue: str, partition: int, seq: int) -> bool:
        return await asyncio.to_thread(self.sync.kill_message, queue, partition, seq)

    async def ack_message(self, queue: str, partition: int, seq: int) -> bool:
        return await asyncio.to_thread(self.sync.ack_message, queue, partition, seq)

    async def close(self) -> None:
        await asyncio.to_thread(self.sync.close)

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()


class AsyncTransaction:
    """A ``ClientTransaction`` for ``async with``: ``ack``, ``nack``, ``reject``, ``publish``
    and ``publish_many`` buffer (plain calls); the commit runs in a worker thread."""

    def __init__(self, tx: ClientTransaction) -> None:
        self.sync = tx
        self.ack, self.nack, self.reject = tx.ack, tx.nack, tx.reject
        self.publish, self.publish_many = tx.publish, tx.publish_many

    @property
    def state(self) -> str:
        return self.sync.state

    async def commit(self) -> None:
        await asyncio.to_thread(self.sync.commit)

    async def __aenter__(self) -> AsyncTransaction:
        return self

    async def __aexit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            self.sync.__exit__(exc_type, exc, tb)
            return
        await self.commit()


class AsyncFlow:
    """A flow for asyncio; ``async for msg in flow`` receives until the flow is unbound."""

    def __init__(self, flow: Flow, batch: int = 100) -> None:
        self.sync = flow
        self.batch = batch
        self._ready: list[Message] = []

    @property
    def partitions(self) -> frozenset[int]:
        return self.sync.partitions

    @property
    def closed(self) -> bool:
        return self.sync.closed

    async def receive(self, max_messages: int = 100, timeout: float = 0.0) -> list[Message]:
        return await asyncio.to_thread(self.sync.receive, max_messages, timeout)

    async def ack(self, msg: Message) -> None:
        await asyncio.to_thread(self.sync.ack, msg)

    async def ack_many(self, msgs: Iterable[Message]) -> None:
        await asyncio.to_thread(self.sync.ack_many, received(msgs))

    def ack_many_async(self, msgs: Iterable[Message]):
        return self.sync.ack_many_async(received(msgs))

    async def nack(self, msg: Message, delay: float | None = None) -> list[int]:
        return await asyncio.to_thread(self.sync.nack, msg, delay)

    async def reject(self, msg: Message, headers: dict | None = None) -> None:
        await asyncio.to_thread(self.sync.reject, msg, headers)

    async def unbind(self, leave: bool = False) -> None:
        await asyncio.to_thread(self.sync.unbind, leave)

    def events(self) -> list[FlowChangeUpdate]:
        return self.sync.events()

    def __aiter__(self) -> AsyncFlow:
        return self

    async def __anext__(self) -> Message:
        while not self._ready:
            if self.sync.closed:
                raise StopAsyncIteration
            self._ready = await self.receive(self.batch, timeout=0.5)
        return self._ready.pop(0)
