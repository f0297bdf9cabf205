"""In-memory peer snapshots: each rank's training state every few steps in host memory, its
own node's and a peer node's, so that a job restarted after a failure loses at most
``checkpoint.snapshot_interval`` steps and reads nothing from the shared filesystem.

- ``placement.py``: nodes and peers (who keeps a copy of whose snapshot);
- ``local_state.py``: the state as this rank's local tensors, and its restore (the
  checkpoint's state dict and load tail);
- ``shard_file.py``: one snapshot as bytes (header, aligned tensors, CRC);
- ``store.py``: a node's snapshot files in a tmpfs, which outlive the processes;
- ``peer_snapshots.py``: the rounds (copy, write, exchange with the peer) and the recovery;
- ``recovery_plan.py``: the step a restart goes on from, and where each shard comes from.

The run's side (when to take one, what a recovery re-applies, the fallback to checkpoints)
is ``trainer/run_checkpoints.py``.
"""
