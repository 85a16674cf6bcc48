"""Session 19: one cuDNN conv (PyTorch, channels-last, cudnn.benchmark) inside a profiler range,
for `ncu --profile-from-start off`: which kernel cuDNN picks and how it launches it.
Usage: python cudnn_layer.py B,C,H,W,M,K,stride,pad,groups fp16|fp32|tf32 [bias]"""
import sys

import torch

spec, cls = sys.argv[1], sys.argv[2]
B, C, H, W, M, K, stride, pad, groups = (int(v) for v in spec.split(","))
torch.backends.cudnn.benchmark = True
torch.backends.cudnn.allow_tf32 = cls == "tf32"
dtype = torch.float16 if cls == "fp16" else torch.float32
conv = torch.nn.Conv2d(C, M, K, stride, pad, groups=groups, bias=len(sys.argv) > 3)
conv = conv.cuda().to(dtype).to(memory_format=torch.channels_last)
x = torch.randn(B, C, H, W, device="cuda", dtype=dtype).to(memory_format=torch.channels_last)
with torch.no_grad():
    for _ in range(5):
        conv(x)
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    conv(x)
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()
print("done", spec, cls)
