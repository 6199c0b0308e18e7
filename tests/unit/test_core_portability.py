"""The C++ core formats text without iostreams, so it runs where the compiler's libstdc++ headers are newer
than the libstdc++ the process loads.

Found on the GPU machine: its Python builds extensions with /opt/gcc's g++, and an ``ostringstream``
formatting an integer crashed the process on the first error message (a corrupt record). ``dlstore::Text``
(csrc/include/dlstore/text.hpp) builds messages instead; this checks that the built extension asks
libstdc++ for no stream or locale at all.
"""
import re
import shutil
import subprocess

import pytest

from dlstore import _C

STREAMS = re.compile(r"std::(basic_\w*stream|basic_ios|locale|ios_base)\b")


@pytest.mark.skipif(shutil.which("nm") is None, reason="nm (binutils) is not installed: cannot list the symbols")
def test_the_extension_uses_no_iostreams_or_locales():
    out = subprocess.run(["nm", "-C", "-D", "--undefined-only", _C.__file__], capture_output=True, text=True,
                         check=True).stdout
    used = sorted({m.group(0) for m in STREAMS.finditer(out)})
    assert not used, f"{_C.__file__} uses {used}: format with dlstore::Text (text.hpp), read with POSIX calls"


def test_messages_still_print_numbers_as_before(tmp_path):
    from dlstore import TFRecordWriter, open_records
    from dlstore.errors import CorruptRecordError

    path = tmp_path / "a.tfrecord"
    with TFRecordWriter(str(path)) as w:
        for _ in range(3):
            w.write(b"x" * 100)
    data = bytearray(path.read_bytes())
    data[116 + 20] ^= 0xFF  # a data byte of the second record, at byte 116
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptRecordError, match=r"a\.tfrecord: at byte 116: bad data CRC in a record of 100 "
                                                 r"bytes: stored 0x[0-9a-f]{8}, computed 0x[0-9a-f]{8}"):
        for _ in open_records(str(path), io="buffered", on_error="raise").batches():
            pass
