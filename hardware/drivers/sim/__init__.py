"""The `sim` driver: a simulated many-core inference accelerator (docs/sim.md)."""

from hardware.drivers.sim.driver import SimDriver

__all__ = ["SimDriver"]
