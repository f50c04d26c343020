"""Publishing: validating and encoding messages in the caller's thread and placing them in the
write transaction (``publisher``), and the load view the adaptive sticky partitioner reads
(``load_sampler``)."""
