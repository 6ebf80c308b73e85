"""Weight-only quantization: round-to-nearest and AWQ, INT4 packing, and the packed linear module."""
