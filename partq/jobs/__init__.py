"""Spark jobs on the library side: rows staged per task attempt and published exactly once when
the job commits (``staged``: the store layout, ``staging``: the verbs, ``commit``: committing and
aborting), and reading sequence ranges of a queue's logs for readers of the log
(``log_ranges``)."""
