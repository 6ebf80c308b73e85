"""Speculative decoding (Lesson 4): drafters propose, the target verifies in one pass,
rejection sampling keeps it exact."""
