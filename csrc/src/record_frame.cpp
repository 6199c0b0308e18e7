#include "dlstore/record_frame.hpp"

#include <cstring>

#include "dlstore/crc32c.hpp"
#include "dlstore/frame_layout.hpp"

namespace dlstore {
namespace {

std::string check_tfrecord(const uint8_t* p, uint64_t size, bool verify, bool file_tail, FramedRecord& out,
                           uint64_t* at) {
  *at = 0;
  // A frame that runs to the end of its file and is too short is a file cut inside its last record (the
  // indexer makes such a tail a frame of its own): said in record_scan's words, not as an index fault.
  if (file_tail && size < kTFHeader) return truncated_header_words(size);
  if (size < kTFHeader + kTFFooter && !file_tail)
    return "the index gives a frame of " + std::to_string(size) +
           " bytes, shorter than a TFRecord header and footer (16 bytes): the index does not match the file";
  const uint64_t length = le64(p);
  if (verify) {
    const uint32_t stored = le32(p + 8), computed = masked_crc32c(p, 8);
    if (stored != computed)
      return "bad length CRC: stored " + hex32(stored) + ", computed " + hex32(computed) + " (length field reads " +
             std::to_string(length) + ")";
  }
  if (file_tail && (size < kTFHeader + kTFFooter || length > size - kTFHeader - kTFFooter))
    return truncated_record_words(Format::TFRecord, length, size, verify);
  if (length != size - kTFHeader - kTFFooter)
    return "the record's length field says " + std::to_string(length) + " bytes of data, but the index gives a " +
           "frame of " + std::to_string(size) + " bytes: the index is stale or the file is corrupt";
  if (verify) {
    const uint32_t stored = le32(p + kTFHeader + length), computed = masked_crc32c(p + kTFHeader, length);
    if (stored != computed)
      return "bad data CRC in a record of " + std::to_string(length) + " bytes: stored " + hex32(stored) +
             ", computed " + hex32(computed);
  }
  out.data = p + kTFHeader;
  out.len = length;
  return "";
}

std::string check_recordio(const uint8_t* p, uint64_t size, bool file_tail, FramedRecord& out, uint64_t* at) {
  // Parts follow each other, each padded to 4 bytes; a lone record (cflag 0) is the common case.
  uint64_t pos = 0;
  bool assembling = false;
  size_t joined = 0;
  for (;;) {
    *at = pos;
    if (size - pos < kRIOHeader)
      return file_tail ? truncated_header_words(size - pos)
                       : "truncated record header: the indexed frame ends " + std::to_string(size - pos) +
                             " bytes into a RecordIO header";
    const uint32_t magic = le32(p + pos);
    if (magic != kRecordIOMagic)
      return "bad RecordIO magic " + hex32(magic) + " (expected " + hex32(kRecordIOMagic) + ")";
    const uint32_t lrec = le32(p + pos + 4);
    const uint32_t cflag = lrec >> 29;
    const uint64_t length = lrec & ((1u << 29) - 1);
    if (size - pos - kRIOHeader < length)
      return file_tail ? truncated_record_words(Format::RecordIO, length, size - pos, true)
                       : "truncated record: the header says " + std::to_string(length) +
                             " bytes of data, but the indexed frame holds only " + std::to_string(size - pos - kRIOHeader);
    const uint8_t* data = p + pos + kRIOHeader;
    // A record's last part ends the indexed frame (padded to 4 bytes): more after it means the index lists
    // fewer records than the file holds (a partial or foreign .idx), and they would be skipped unseen.
    auto ends_frame = [&]() -> std::string {
      const uint64_t end = pos + kRIOHeader + length;
      if (size - end <= ((4 - length % 4) % 4)) return "";
      *at = end;
      return "the indexed frame holds " + std::to_string(size) + " bytes but its record takes " +
             std::to_string(end) + " of them: the index lists fewer records than the file holds (or wrong offsets)";
    };
    if (!assembling) {
      if (cflag == 0) {
        out.data = data;
        out.len = length;
        return ends_frame();
      }
      if (cflag != 1)
        return "RecordIO continuation part (cflag " + std::to_string(cflag) + ") without a start part";
      assembling = true;
      // The joined record is no longer than the frame: each 8-byte header becomes a 4-byte magic.
      out.assembled = std::make_shared<AlignedBuffer>(static_cast<size_t>(size) + 64, 64);
    } else if (cflag <= 1) {
      return "multi-part RecordIO record has no end part: a cflag " + std::to_string(cflag) + " frame follows";
    }
    // Parts were split where the payload held the magic word; it goes back between them.
    std::memcpy(out.assembled->data() + joined, data, length);
    joined += length;
    if (cflag == 3) {
      out.data = out.assembled->data();
      out.len = joined;
      return ends_frame();
    }
    const uint32_t m = kRecordIOMagic;
    std::memcpy(out.assembled->data() + joined, &m, 4);
    joined += 4;
    pos += kRIOHeader + ((length + 3) & ~uint64_t(3));
    if (pos >= size) {
      *at = 0;
      return "truncated multi-part RecordIO record: the indexed frame ends before its last part (cflag 3)";
    }
  }
}

}  // namespace

std::string check_frame(Format format, const uint8_t* p, uint64_t size, bool verify, bool file_tail,
                        FramedRecord& out, uint64_t* at) {
  out = FramedRecord{};
  return format == Format::TFRecord ? check_tfrecord(p, size, verify, file_tail, out, at)
                                    : check_recordio(p, size, file_tail, out, at);
}

}  // namespace dlstore
