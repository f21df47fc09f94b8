"""What a byte of training memory is for."""

from enum import Enum


class MemoryCategory(str, Enum):
    """Role of one tensor storage during a training step."""

    PARAMETER = "parameters"
    """Weights registered with ``nn.Parameter`` (the fp32 masters under mixed precision)."""

    BUFFER = "buffers"
    """Registered buffers: BatchNorm running statistics, rotary tables, masks."""

    INPUT = "input_batch"
    """The input batch and the loss targets handed to the step."""

    GRADIENT = "gradients"
    """Storage that ends up as a parameter's ``.grad``."""

    OPTIMIZER_STATE = "optimizer_state"
    """Tensors kept in ``optimizer.state`` across steps (momentum, Adam moments, step counters)."""

    ACTIVATION = "activations"
    """Made in the forward pass (model and loss) and still alive when backward starts:
    tensors saved for backward, module outputs, the loss."""

    TEMPORARY = "temporaries"
    """Everything else the step makes: forward intermediates freed before backward,
    gradients of activations in backward, scratch of the optimizer step."""

    WORKSPACE = "workspaces"
    """Library scratch allocated through the caching allocator for one kernel and freed when
    it returns: cuDNN convolution workspaces (and, with ``cudnn.benchmark``, the buffer its
    plan search times candidates in)."""
