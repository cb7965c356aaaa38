"""The batch and KV types that runners and attention backends share.

* :class:`StepInput`: one forward as the scheduler describes it, on the host;
* :class:`ForwardBatch`: the device tensors that forward reads (what a backend is given), and
  :class:`StaticBatch`, the fixed buffers a captured graph's batches are views of;
* :class:`RowState`: per-row state the next forward continues from;
* :class:`KVPool`: the KV cache and the scheduler-shared tables that address it;
* :class:`HostStaging`: the ring of persistent host buffers each forward's inputs are staged in;
* :class:`ModelShape`, :class:`Model`, :class:`LayerAttention`: what these layers need of a
  model, as Protocols, so nothing here or in ``warcore.runners`` imports the engine.

Sits between ``warcore.device`` and ``warcore.attention``: imports only ``warcore.core``.
"""

from warcore.batch._forward import ForwardBatch, RowState, StagedInputs, StaticBatch, StepInput
from warcore.batch._kv_pool import KVPool
from warcore.batch._model import LayerAttention, Model, ModelShape
from warcore.batch._staging import HostStaging, staging_depth

__all__ = [
    "ForwardBatch",
    "HostStaging",
    "KVPool",
    "LayerAttention",
    "Model",
    "ModelShape",
    "RowState",
    "StagedInputs",
    "StaticBatch",
    "StepInput",
    "staging_depth",
]
