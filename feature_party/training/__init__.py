"""Training on received noisy labels: preprocessing, losses, the loop, multi-GPU.

Everything here is post-processing of a DP release (DESIGN.md §1): it never sees
raw labels and spends no budget.
"""
