"""The `torch` driver: any torch device (cpu, cuda, cuda:N), with its own concerns beside it: the on-device
checks read back in batches (checks.py), the device-side checkpoint pool (device_pool.py) and the CUDA
caching allocator's view of an address (cuda_allocator.py)."""

from hardware.drivers.torch.driver import TorchDriver

__all__ = ["TorchDriver"]
