"""What a consumer reads, and how it finds the records in the files.

- :mod:`dlstore.sources.reader`: :func:`~dlstore.open_records`, files front to back.
- :mod:`dlstore.sources.dataset`: :class:`~dlstore.Dataset`, a rank's share of a dataset over mounts,
  shuffled and resumable, read through a plan of byte ranges.
- :mod:`dlstore.sources.source`: the :class:`~dlstore.sources.source.Source` protocol both follow (what the
  loader and the adapters read) and :class:`~dlstore.ReadOptions`.
- :mod:`dlstore.sources.indexing`: the per-file indexes and the dataset manifest, built once (under a
  lock), validated against the files, found beside the data or in the cache directory.

May import: :mod:`dlstore.formats`, :mod:`dlstore.io`, :mod:`dlstore.placement`, ``settings``, ``errors``
and the C++ core; never the pipelines, adapters, bench or tools.
"""
