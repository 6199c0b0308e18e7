// One record frame whose place and size an index gave: checked (framing, CRCs) and its payload found,
// without scanning. The counterpart of record_scan for reads that jump from record to record.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "dlstore/aligned_buffer.hpp"
#include "dlstore/record_scan.hpp"

namespace dlstore {

struct FramedRecord {
  const uint8_t* data = nullptr;  // the payload
  uint64_t len = 0;
  // A multi-part RecordIO record is joined here (its parts lie apart in the file); else empty.
  std::shared_ptr<AlignedBuffer> assembled;
};

// Checks the frame of `size` bytes at `p` (a whole TFRecord frame, or every part of a RecordIO
// record) and points `out` at its payload. Returns "" when it is sound, else what is wrong, in the
// words of record_scan's messages; `at` is then set to the frame-relative offset of the problem.
// `file_tail`: the frame runs to the end of its file, so a frame too short for its header's length is
// a file cut inside its last record (a truncated shard indexed as it is), not an index that is wrong.
std::string check_frame(Format format, const uint8_t* p, uint64_t size, bool verify, bool file_tail,
                        FramedRecord& out, uint64_t* at);

}  // namespace dlstore
