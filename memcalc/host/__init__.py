"""Host side of a training job: RAM of the main process and the DataLoader workers."""

from memcalc.host.machine import detect_machine, machine_from_options
from memcalc.host.measure import measure_worker, measured_host_estimate
from memcalc.host.workers import host_estimate
from memcalc.host.report import HostReport, WorkerMeasurement
from memcalc.host.specs import HostSpec, LoaderSpec, MachineSpec, StartMethod

__all__ = ["HostReport", "HostSpec", "LoaderSpec", "MachineSpec", "StartMethod",
           "WorkerMeasurement", "detect_machine", "host_estimate", "machine_from_options",
           "measure_worker", "measured_host_estimate"]
