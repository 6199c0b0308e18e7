"""Tools behind ``dlstore <command>`` that prepare storage rather than read it.

- :mod:`dlstore.tools.expand`: ``dlstore expand``, K copies of every shard to make a dataset larger
  than every cache, as the Dell EMC Isilon reference architecture did 150x.
- :mod:`dlstore.tools.convert`: ``dlstore convert``, a folder of class folders of images to TFRecord
  (TensorFlow's ImageNet converter's features) or RecordIO (MXNet's ``im2rec`` layout).
- :mod:`dlstore.tools.testbed`: ``dlstore testbed``, N loop-mounted filesystems on one host, each
  optionally throttled, to emulate a multi-mount storage system (root only).
- :mod:`dlstore.tools.simulate`: ``dlstore plan --simulate``, one rank's plan of a dataset given as counts.
- :mod:`dlstore.tools.info`: ``dlstore info``, what this machine offers dlstore.
- :mod:`dlstore.tools.commands`: the shared parts of the commands.

May import anything in dlstore below the command line (formats, io, placement, sources, pipeline,
writers, settings); never :mod:`dlstore.bench` or :mod:`dlstore.cli`.
"""
