"""Data parallelism across islands: whole-model replicas (one jitted step
each), ZeRO-1's sharded optimizer state, pipeline replicas, and bucketed
gradient reductions overlapped with the backward."""
