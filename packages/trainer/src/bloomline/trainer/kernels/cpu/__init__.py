"""CPU kernels: each module has one entry point the model calls and falls back to ATen's op
wherever its kernel does not apply (other devices, tensor subclasses, compiled regions)."""
