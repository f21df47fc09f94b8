"""Cases measured for real on CPU (profiler memory timeline) by tests and benchmarks."""

TINY_GPT2 = dict(vocab=1000, n_positions=128, dim=128, depth=2, heads=4)
TINY_LLAMA = dict(vocab=1000, dim=128, depth=2, heads=4, hidden=344, max_positions=128)
TINY_MLP = dict(in_features=256, hidden=1024, depth=2)
TINY_VIT = dict(image_size=64, dim=128, depth=2, heads=4, num_classes=10)

# Linear and attention models: the trace should match a real CPU run within ±3 %.
CPU_TRUTH_CASES = {
    "mlp-adam": dict(model="mlp", model_args=TINY_MLP, sample_shape=(256,), batch_size=32),
    "mlp-sgd-momentum-mse": dict(model="mlp", model_args=TINY_MLP, sample_shape=(256,),
                                 batch_size=32, optimizer="sgd-momentum", loss="mse"),
    "mlp-rmsprop-sum": dict(model="mlp", model_args=TINY_MLP, sample_shape=(256,),
                            batch_size=16, optimizer="rmsprop", loss="sum"),
    "mlp-adagrad": dict(model="mlp", model_args=TINY_MLP, sample_shape=(256,), batch_size=8,
                        optimizer="adagrad"),
    "mlp-bf16-mixed": dict(model="mlp", model_args=TINY_MLP, sample_shape=(256,),
                           batch_size=32, precision="bf16-mixed"),
    "mlp-pure-bf16": dict(model="mlp", model_args=TINY_MLP, sample_shape=(256,),
                          batch_size=32, precision="bf16"),
    "gpt2-sdpa-embeddings-tied": dict(model="gpt2", model_args=TINY_GPT2, sample_shape=(128,),
                                      batch_size=4),
    "gpt2-adamw-bf16-mixed": dict(model="gpt2", model_args=TINY_GPT2, sample_shape=(64,),
                                  batch_size=4, optimizer="adamw", precision="bf16-mixed"),
    "llama-rope-swiglu": dict(model="llama_7b", model_args=TINY_LLAMA, sample_shape=(64,),
                              batch_size=2),
    "gpt2-checkpointed": dict(model="gpt2", model_args=TINY_GPT2, sample_shape=(128,),
                              batch_size=4, activation_checkpointing=True),
    "llama-checkpointed-bf16-mixed": dict(model="llama_7b", model_args=TINY_LLAMA,
                                          sample_shape=(64,), batch_size=2,
                                          activation_checkpointing=True, precision="bf16-mixed"),
}

# Convolutional models: CPU kernels (oneDNN, im2col) allocate workspaces the trace does not
# see, so a real CPU run can peak higher. Measured and reported, not asserted to ±3 %.
CPU_CONV_CASES = {
    "resnet50-64px": dict(model="resnet50", model_args=dict(num_classes=10),
                          sample_shape=(3, 64, 64), batch_size=2),
    "vit-patch-conv": dict(model="vit_b16", model_args=TINY_VIT, sample_shape=(3, 64, 64),
                           batch_size=4),
    "resnet3d-10": dict(model="resnet3d", model_args=dict(depth=10, num_classes=10),
                        sample_shape=(3, 16, 32, 32), batch_size=2),
    "unet3d-small": dict(model="unet3d", model_args=dict(base_channels=8, levels=3),
                         sample_shape=(1, 32, 32, 32), batch_size=1),
}
