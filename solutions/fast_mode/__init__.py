"""Lesson 7: every layer on at once, and the fast-mode claims checked against our own numbers.

planner           Lab 7: a latency target and a machine's measured figures in, batch cap, speculation and
                  quantization out (``choose_fast_mode``), from a decode-step cost model (``predict``)
measure           the planner's figures measured on this machine with the engine itself
bus               the engine's own scheduler on a virtual clock: arrival rate and batch cap in, TTFT out
frontier          per-user against aggregate speed, cost per million tokens, where "2.5x for 6x" falls
decode_roofline   tokens/s from bytes per token and bandwidth, off-chip memory or on-chip SRAM
gpu_results       the GPU measurements committed under results/, newest first
"""
