"""GPU fast paths: CUDA-graph verifier/drafter (`graphs`), the device-resident greedy loop (`fast`) and
Triton kernels with their PyTorch references (`kernels`). Importing this package needs no GPU."""
