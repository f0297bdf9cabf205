"""The checks of ``make gpu-check`` (``python -m benchmarks.gpu_check``), which a CPU cannot run,
one module each.

- ``attention_check``: a. FlexAttention's ALiBi against the eager kernel, forward and backward,
  fp32 and bf16, whole head ranges and tensor-parallel shards, and on packed documents.
- ``step_check``: b. a short bf16 run of ``configs/350m.toml`` on one GPU.
- ``equivalence_check``: c. dp2 and tp2 over NCCL against one GPU, loss per step.
- ``throughput_check``: d. ``gpu_throughput.sh`` with ``trainer plan``'s prediction beside it.
- ``trainer_runs``: the demo corpus, ``trainer pretrain`` in a subprocess, its metrics.
- ``results``: the result row, the tensor comparison, the table, the exit status.
- ``plan_device``: a CUDA device name -> the planner's device table.
- ``cuda_probe``: why there is no usable GPU (exit 2).

What each check holds the trainer to: benchmarks/README.md.
"""
