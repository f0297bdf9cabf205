"""CPU kernels: each module has one entry point the model calls and falls back to ATen's op
wherever its kernel does not apply (other devices, tensor subclasses, compiled regions)."""

__all__ = ["CPU_FP32_MATMUL_CHOICES"]

# the kernels of fp32 linear layers on CPU (``train.cpu_fp32_matmul``; linear.py applies the
# choice). Here, not in linear.py: the config schema declares the field without torch.
CPU_FP32_MATMUL_CHOICES = ("auto", "aten", "onednn")
