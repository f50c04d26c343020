"""partq's admin tool: the ``partq`` command (``partq --data DIR <command>``).

A thin click layer over the library, split by command group: each command parses its options,
calls the library (``partq.browse``, ``partq.copyout``, ``partq.verify``, ``partq.stats``, the
Broker) and prints the result, for people or with ``--json``.

* ``cli``          the root group, ``main``, error translation (one "Error: ..." line, exit 1)
* ``common``       the store the command works on, confirmations, status helpers
* ``output``       ``--json`` (one decorator), aligned tables, payload and time formatting
* ``queue_cmds``   ``queue create|list|show|update|delete``
* ``store_cmds``   ``init``, ``stats`` (``partq.stats``), ``demo``
* ``inspect_cmds`` ``inspect``: browse messages without consuming (``partq.browse``)
* ``copy_cmds``    ``copy-out`` (the resumable copy itself is ``partq.copyout``)
* ``scale_cmds``   ``scale`` (the seed's seven steps are ``partq.scaling``)
* ``verify_cmds``  ``verify``: crc32c of every stored record (``partq.verify``)
"""
