"""Region drivers: one interface (base.WorkloadDriver), one implementation per kind of region."""

from regions.drivers.base import DriverError, ObservedWorkload, WorkloadDriver, WorkloadSpec

__all__ = ["DriverError", "ObservedWorkload", "WorkloadDriver", "WorkloadSpec"]
