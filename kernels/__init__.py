"""Verification kernels (Triton) with torch twins and a dispatcher. Installed as lookupspec.kernels."""
