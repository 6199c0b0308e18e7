"""Framework adapters, one module per framework over a shared base (:mod:`dlstore.adapters.base`).

- :mod:`dlstore.adapters.torch`: ``DlstoreIterableDataset`` (sharded over ranks and DataLoader
  workers), ``TorchLoader`` (the native loader's batches as torch tensors, to the GPU from pinned
  memory), ``pinned_allocator``.
- :mod:`dlstore.adapters.tensorflow`: ``as_tf_dataset`` (a ``tf.data.Dataset`` with a proper
  ``element_spec``).
- :mod:`dlstore.adapters.dali`: ``dali_pipeline`` (dlstore reads, ``fn.external_source`` feeds the
  encoded JPEGs to DALI's decoder), ``EncodedSamples``.

Importing this package or any adapter module imports no framework; each adapter imports its
framework when first used. Last-batch policies are named as DALI names them: ``FILL``, ``DROP``,
``PARTIAL`` (:class:`~dlstore.adapters.base.LastBatch`). See docs/adapters.md.

May import: :mod:`dlstore.pipeline`, :mod:`dlstore.sources`, :mod:`dlstore.placement`, :mod:`dlstore.io`,
:mod:`dlstore.formats`, ``errors``; each framework only inside the functions that need it.
"""
from dlstore.adapters.base import LastBatch

__all__ = ["LastBatch"]
