"""Compiled CPU kernels the model layers call where the CPU and a compiler allow."""
