"""The runtime's C kernels for x86 CPUs, each built with the system compiler on first use.

- ``matmul.py`` / ``matmul.c``: the streaming float32 matmul of the packed linear layers
  (:mod:`lookupspec.runtime.cpu_linear`).
- ``attention.py`` / ``attention.c``: one layer's attention for a whole ragged batch in one call.
- ``layer_ops.py`` / ``layer_ops.c``: the lean forward's element-wise steps (rotary embedding with
  the KV-pool writes, residual sum and RMSNorm) with torch's roundings.
- ``simd.h``: the 16-lane vector operations the C sources share (AVX-512 or AVX2 + FMA).
- ``loader.py``: compiling, caching and loading a source, and the setting (an environment
  variable) that turns each kernel on, off or to ``auto``.

Every kernel fixes the order of its float32 operations per output, so a row's bits do not depend on
the other rows of its batch or the thread count; where a kernel cannot be built the runtime keeps
the torch path it replaces.
"""

from . import attention, layer_ops, loader, matmul

__all__ = ["attention", "layer_ops", "loader", "matmul"]
