"""One training step traced on fake tensors: the step body, the ledger of every storage, the
rewrites that make CPU kernels keep what CUDA kernels keep, and the step's FLOPs."""
