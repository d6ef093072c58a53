"""Compaction: a finished model's result arrays rewritten as a few objects (`results`), and
expanded back to one chunk per shard when some of its shards must be tested again."""
