"""A shard node on the bus: register, heartbeat, follow the plan, serve its stage of the pipeline."""
