"""Run the user's real DataLoader for ``memcalc host --verify`` (a subprocess).

``python -m memcalc.host.verify_run '<json config>' FD`` writes one JSON object per line to
file descriptor FD: ``started`` once the Dataset is built, ``batch`` per batch the main
process takes, and a final ``result`` (or ``error`` / ``input_error``). The main process holds
each batch for a simulated step; the first one long enough for every worker to fill its
prefetch queue (as at an epoch start, the usual peak). It dies with memcalc, and its workers
with it (``memcalc.host.child_events``), so a killed memcalc leaves nothing running.
"""

from __future__ import annotations

import multiprocessing
import time
from typing import Any

from memcalc.host.child_events import emit, run_child

FIRST_HOLD_S = 1.0
"""Least time the first batch is held, so the workers' queues fill behind it."""


def run(config: dict[str, Any]) -> dict[str, Any]:
    import torch
    from torch.utils.data import DataLoader

    from memcalc.model.user_code import load_dataset

    dataset = load_dataset(config["dataset"])
    emit("started")
    workers = config["num_workers"]
    options = ({"prefetch_factor": config["prefetch_factor"],
                "multiprocessing_context": multiprocessing.get_context(config["start_method"]),
                "persistent_workers": config["persistent_workers"]} if workers else {})
    loader = DataLoader(dataset, batch_size=config["batch_size"], shuffle=True,
                        num_workers=workers, pin_memory=config["pin_memory"]
                        and torch.cuda.is_available(), **options)
    start = time.monotonic()
    deadline, stopped_by, taken = start + config["seconds"], "dataset end", 0
    for index, _trained_on in enumerate(loader):    # held while the step 'runs'
        taken = index + 1
        emit("batch", index=index)
        if taken >= config["batches"]:
            stopped_by = "batches"
            break
        # the first batch took as long as each worker's first: queues of prefetch_factor
        # batches fill in about that many times as long
        hold = (max(FIRST_HOLD_S, 1.5 * config["prefetch_factor"] * (time.monotonic() - start))
                if index == 0 and workers else config["step_s"])
        time.sleep(max(0.0, min(hold, deadline - time.monotonic())))
        if time.monotonic() > deadline:
            stopped_by = "time"
            break
    return {"batches": taken, "stopped_by": stopped_by, "seconds": time.monotonic() - start}


def main() -> None:
    run_child(run)


if __name__ == "__main__":
    main()
