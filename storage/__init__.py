"""The store: the only place that knows group/array names, chunking, completion markers and the
run fingerprint. Everything else calls it."""
