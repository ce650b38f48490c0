"""The static-shape step (issue 50, in progress): a step's rows in fixed buckets, one upload, a
forward with no host sync, captured as a CUDA graph per bucket. The runner's forwards go through it
where ``--cuda-graphs`` asks (``auto``: on CUDA devices; :mod:`.serving`); until a GPU run has
validated it (``scripts/gpu-check.sh``, docs/gpu.md), the CPU keeps its ragged path by default.

- ``buckets.py``: :class:`Bucket` (rows x sequences) and :class:`BucketConfig` (which buckets exist,
  the choice of one for a step);
- ``layout.py``: a step's rows laid into a bucket as fixed-shape int64 index tensors in one buffer
  (:class:`InputTable`, :func:`lay_out`), padding rows aimed at a scratch slot;
- ``forward.py``: :class:`StaticForward`, the Llama-family forward over a bucket (index-tensor KV
  writes, :func:`lookupspec.kernels.tree_attention`);
- ``step.py``: :class:`StaticStep`, plan, upload and run eagerly over a KV pool;
- ``graphs.py``: :class:`GraphStep`, each bucket's forward captured as a CUDA graph and replayed,
  eager with a logged reason where a graph cannot run;
- ``serving.py``: :class:`StaticPath`, the above as ``ModelRunner``'s plan and run, and
  :func:`serves`, which runners it serves (the ragged path keeps the rest, with a logged reason).
"""

from .buckets import Bucket, BucketConfig
from .forward import StaticForward, unsupported
from .graphs import GRAPH_MODES, GraphStep, graph_unsupported
from .layout import InputTable, StepTensors, lay_out, tree_bits
from .serving import COMMON_ROWS, StaticPath, serves
from .step import StaticStep, StepPlan

__all__ = [
    "COMMON_ROWS",
    "GRAPH_MODES",
    "Bucket",
    "BucketConfig",
    "GraphStep",
    "InputTable",
    "StaticForward",
    "StaticPath",
    "StaticStep",
    "StepPlan",
    "StepTensors",
    "graph_unsupported",
    "lay_out",
    "serves",
    "tree_bits",
    "unsupported",
]
