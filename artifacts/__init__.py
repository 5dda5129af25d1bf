"""Model artifacts: content-addressed object stores, ingest into the home store, and verified, resumable
replication into each region's store (residency checked before a byte moves)."""
