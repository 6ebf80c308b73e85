"""Tensor parallelism (Lesson 9): one model split across processes by heads, over ``torch.distributed``."""
