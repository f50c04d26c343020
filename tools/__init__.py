"""partq's admin tool: the ``partq`` command (``partq --data DIR <command>``).

A thin click layer over the library, split by command group:

* ``cli``          the root group, ``main``, error translation (one "Error: ..." line, exit 1)
* ``common``       the store the command works on, confirmations, status helpers
* ``output``       ``--json`` (one decorator), aligned tables, payload and time formatting
* ``queue_cmds``   ``queue create|list|show|update|delete``
* ``store_cmds``   ``init``, ``stats``, ``demo``
* ``inspect_cmds`` ``inspect``: browse messages from a read snapshot, never binding
* ``copy_cmds``    ``copy-out`` (the resumable copy itself lives in ``copyout``)
* ``scale_cmds``   ``scale`` (the seed's seven steps live in ``scaling``)
* ``verify_cmds``  ``verify``: crc32c of every stored record
"""
