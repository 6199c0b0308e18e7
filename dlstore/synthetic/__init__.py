"""Synthetic datasets with the byte profile of the real ones: ImageNet-like JPEG shards and BERT features.

They stand in for data a user may not have at hand (``dlstore gen``, and the benchmarks when no
``--data`` is given). What matters for a storage benchmark is what the reader sees: record sizes,
shard sizes, and JPEGs that cost what photos cost to decode. So the images are real JPEGs of
ImageNet's size (each side 300..500 px, 110-120 KB a record on average), and the BERT records carry
the seven pretraining features with the layout and value ranges of ``create_pretraining_data.py``.

Every record is a pure function of ``(seed, record number)``: the same seed gives the same bytes
whatever the number of worker processes. Pillow is needed for the JPEGs and is imported only when
images are made.

What lives here, one module a job (each imports only those before it in this list):

- :mod:`.images`: photo-like JPEGs (Pillow);
- :mod:`.shards`: writing shards in order from worker processes;
- :mod:`.imagenet` and :mod:`.bert`: the records of each kind, and their generators;
- :mod:`.cache`: named presets kept in a locked cache.

Of the rest of dlstore it may import :mod:`dlstore.formats`, ``writers``, ``settings`` and the
progress bar; never the sources, pipelines or bench (the bench imports it).
"""
# The token ids and the generator version stay reachable here, as before the package was split.
from dlstore.synthetic.bert import CLS_ID, MASK_ID, PAD_ID, SEP_ID, VOCAB_SIZE, generate_bert  # noqa: F401
from dlstore.synthetic.cache import GENERATOR_VERSION, PRESETS, cached_dataset, cached_paths  # noqa: F401
from dlstore.synthetic.imagenet import generate_imagenet

__all__ = ["generate_imagenet", "generate_bert", "cached_dataset", "cached_paths", "PRESETS"]
