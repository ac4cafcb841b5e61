"""Tensor parallelism of the target (Megatron-style) on torch.distributed: NCCL on CUDA, gloo on CPU.

Modules: `group` (checking `--tensor-parallel N`, joining the process group torchrun started), `shard`
(splitting a loaded `Transformer` across ranks), `verifier` (`TensorParallelVerifier`: the sharded target
under the engine's one loop, rank 0 deciding), `drafts` (rank 0's draft blocks reaching the other ranks),
`scaling` (the modeled step time of 7B/70B targets at TP N). Import from the modules; this file stays
empty so importing one part never loads the others.
"""
