"""Sharded primaries (design/sharding.md): where each shard's replicas go, and which shard owns a queue."""
