"""What a run tells its user: each step's record and console line (``monitor.py``), the sinks
(``metrics.py``: metrics.jsonl and TensorBoard; ``wandb_sink.py``), the matmul peak MFU divides
by (``mfu.py``, ``cpu_load.py``), elapsed time and ETA (``clock.py``), the end-of-run summary
(``summary.py``) and the picture of a run (``plot.py``, from ``records.py``).

Nothing here changes what a run computes: the loop hands it numbers, it reports them.
"""
