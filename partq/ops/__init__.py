"""The operator's verbs as library functions, used by the ``partq`` command: browsing
(``browse``), copy-out and copy-in (``copy_out``, ``copy_in``, their files and queues in
``copy_targets``), checksums (``verify``), what a store holds (``stats``), reading a directory
without writing it (``read_only``), messages from text (``message_input``), and how values are
written down for people and JSON (``formatting``)."""
