"""Every write of the artifacts app: ``replication`` (copies, their compare-and-set transitions, residency),
``ingest`` (into the home store), ``garbage`` (collection), and ``scheduling`` (what asks for a copy or an
ingest and enqueues it: the API, registry's listeners, the reconciler's gate)."""
