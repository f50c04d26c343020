"""Flows bound in other processes of the same host: the owner's side of the control channel
(``owner_channel``), a peer process's connection to it (``link``), and the flows it serves
(``peer_delivery``, ``peer_flow``): they read and ack their partitions in LMDB from their own
process, fenced against the owner's assignments."""
