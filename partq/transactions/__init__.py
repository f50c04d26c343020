"""Transactions (rule `transactions`): acks, nacks and rejects of received messages and
publishes to other queues, in one commit or none (``Broker.transaction``,
``Client.transaction``)."""
from partq.transactions.transaction import BrokerTransaction, Transaction

__all__ = ["BrokerTransaction", "Transaction"]
