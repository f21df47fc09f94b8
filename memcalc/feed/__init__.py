"""Does the DataLoader keep the GPU fed: the feeding model, its sizing of workers, and a real
loader checked against it."""
