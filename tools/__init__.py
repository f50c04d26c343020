"""partq's admin tool: the ``partq`` command (``partq --data DIR <command>``).

A thin click layer over the library, split by command group: each command parses its options,
calls the library (``partq.ops``: browse, copy-out, verify, stats; the Broker) and prints the
result, for people or with ``--json``.

* ``cli``          the root group, ``main``, error translation (one "Error: ..." line, exit 1)
* ``command_table`` each command's name, module and first help sentence: a command loads when
  it is named
* ``common``       the store the command works on (read-only when it must be), confirmations,
  the translation of library errors (option names for config fields)
* ``output``       ``--json`` (one decorator), aligned tables, payload and time formatting
* ``queue_cmds``   ``queue create|list|show|update|delete``
* ``publish_cmds`` ``publish``: messages from arguments, stdin lines or JSON Lines
  (``partq.ops.message_input``)
* ``consume_cmds`` ``consume``: receive and print as one more consumer, acking or not
* ``store_cmds``   ``init``, ``stats`` (``partq.ops.stats``), ``demo``
* ``inspect_cmds`` ``inspect``: browse messages without consuming (``partq.ops.browse``)
* ``copy_cmds``    ``copy-out`` and ``copy-in`` (the copies themselves are ``partq.ops.copy_out`` and
  ``partq.ops.copy_in``)
* ``dead_cmds``    ``message kill|ack`` (unblock a partition by a message's position) and
  ``dead requeue`` (a dead message queue's messages back to their queues: ``partq.ops.requeue``)
* ``scale_cmds``   ``scale`` (the seven steps are ``partq.scaling``)
* ``worker_cmds``  ``worker MODULE:ATTR``: run a ``partq.Worker``'s handlers (``partq.worker``)
* ``verify_cmds``  ``verify``: crc32c of every stored record (``partq.ops.verify``)
* ``clidoc``       docs/cli.md's command reference, generated from the commands' help
"""
