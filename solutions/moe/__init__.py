"""Lesson 5: Mixture-of-Experts routing, load balance, token permutation, and the dense-to-MoE conversion."""
