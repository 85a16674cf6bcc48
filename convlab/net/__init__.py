"""Networks: the planned forward pass over fixed device buffers, host-to-host pipelines and
CUDA graphs, the datasets, training, weight import, ImageNet input, and PyTorch's same pass."""
