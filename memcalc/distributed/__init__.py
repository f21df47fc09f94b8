"""The distributed job: one rank of an N-GPU training job, traced as it is launched.

A fake process group of the job's world size (collectives are no-ops), a device mesh from
the layout, and the real wrappers (DDP, FSDP2's ``fully_shard``) applied to the model in
order, one function per parallelism (``parallelize``); the tracer then runs the rank's
training step and sees every tensor the wrappers allocate.
"""
