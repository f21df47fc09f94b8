"""Measurements on a real CUDA GPU: the environment floor, cuDNN workspaces, training steps.

Used by ``memcalc calibrate`` (which writes an environment profile) and by the GPU benchmark
(``python -m benchmarks.gpu``). Nothing here runs without a GPU; the pure models fitted to
what is measured live in ``memcalc.trace.cudnn_workspace`` and ``memcalc.device.env_profile``.
"""
