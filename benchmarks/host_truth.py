"""Independent truth for the host tests: a real DataLoader, its RAM measured by PSS.

``python -m benchmarks.host_truth DATASET WORKERS BATCH PREFETCH BATCHES [STEP_S]`` prints the peak
RAM of the process tree (private PSS of main + workers, plus /dev/shm in use) while a
consumer trains slowly on the first batch (workers fill their queues, as at an epoch start)
and then takes one batch per step.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time

from torch.utils.data import DataLoader

from memcalc.host.procmem import host_total_bytes, shm_used_bytes
from memcalc.references import import_callable

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

FIRST_STEP_S = 1.0
STEP_S = 0.05


def main() -> None:
    reference, workers, batch_size, prefetch, batches = sys.argv[1:6]
    step_s = float(sys.argv[6]) if len(sys.argv) > 6 else STEP_S
    dataset = import_callable(reference, "dataset")()
    shm_baseline = shm_used_bytes()
    peak, stop = [0], [False]

    def watch():
        while not stop[0]:
            peak[0] = max(peak[0], host_total_bytes(os.getpid(), shm_baseline))
            time.sleep(0.002)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    loader = DataLoader(dataset, batch_size=int(batch_size), shuffle=True,
                        num_workers=int(workers),
                        prefetch_factor=int(prefetch) if int(workers) else None)
    for index, _trained_on in enumerate(loader):   # held while the step 'runs'
        time.sleep(FIRST_STEP_S if index == 0 else step_s)
        if index + 1 >= int(batches):
            break
    stop[0] = True
    thread.join()
    print(json.dumps({"peak_bytes": peak[0]}))


def truth_peak_bytes(name: str, workers: int, prefetch: int = 2) -> int:
    """Run this script on ``HOST_CASES[name]`` in a fresh interpreter; its peak bytes."""
    from benchmarks.host_datasets import HOST_CASES

    case = HOST_CASES[name]
    completed = subprocess.run(
        [sys.executable, "-m", "benchmarks.host_truth", f"benchmarks.host_datasets:{name}",
         str(workers), str(case.batch_size), str(prefetch), str(case.truth_batches),
         str(case.truth_step_s)],
        capture_output=True, text=True, cwd=ROOT, timeout=300, check=True)
    return json.loads(completed.stdout.splitlines()[-1])["peak_bytes"]


if __name__ == "__main__":
    main()
