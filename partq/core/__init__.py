"""The pure cores: events in, actions out, time as a number; no I/O, no clock, no randomness of
their own. The rebalancer (``rebalancer``) and its dry-run plan (``rebalance_plan``), the unkeyed
partitioners (``partitioners``) and the key-to-partition hash (``key_hash``)."""
