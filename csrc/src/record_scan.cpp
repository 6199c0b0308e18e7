#include "dlstore/record_scan.hpp"

#include <atomic>
#include <cstdio>
#include <cstring>

#include "dlstore/crc32c.hpp"
#include "dlstore/error.hpp"
#include "dlstore/frame_layout.hpp"

namespace dlstore {

Format parse_format(const std::string& name) {
  if (name == "tfrecord") return Format::TFRecord;
  if (name == "recordio") return Format::RecordIO;
  throw_error(ErrorKind::Generic, "", -1, "unknown record format '" + name + "' (tfrecord, recordio)");
}

void RecordBatch::clear() {
  owner.reset();
  base = nullptr;
  region_len = 0;
  file_index = 0;
  offsets.clear();
  lengths.clear();
  file_offsets.clear();
  file_indices.clear();
  paths.reset();
  payload_bytes = 0;
}

RecordScanner::RecordScanner(ChunkStream& src, std::shared_ptr<const std::vector<std::string>> paths,
                             ScanOptions opts)
    : src_(src), paths_(std::move(paths)), opts_(opts) {
  if (opts_.verify && opts_.format == Format::TFRecord && opts_.verify_threads > 0)
    verifiers_.reset(new ThreadPool(opts_.verify_threads, "CRC threads (verify_threads)"));
}

void RecordScanner::verify_batch(RecordBatch& out) {
  const size_t n = out.size();
  if (n == 0) return;
  std::vector<uint8_t> bad(n, 0);
  // The caller and the helper threads take records from one counter, so whichever thread the
  // read-ahead pre-empts does less, and nobody waits long for the other: a fixed split left a
  // core idle whenever the halves finished apart.
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t i = next.fetch_add(1, std::memory_order_relaxed); i < n;
         i = next.fetch_add(1, std::memory_order_relaxed))
      bad[i] = masked_crc32c(out.base + out.offsets[i], out.lengths[i]) != stored_crcs_[i];
  };
  std::vector<std::future<void>> helpers;
  if (verifiers_ && n > 1 && out.payload_bytes >= (256u << 10))
    for (size_t k = 0; k < verifiers_->size(); ++k) helpers.push_back(verifiers_->submit(work));
  work();
  for (auto& h : helpers) h.get();  // each finishes its last record, then finds the counter spent
  size_t keep = 0;
  for (size_t i = 0; i < n; ++i) {
    if (bad[i]) {
      const uint32_t computed = masked_crc32c(out.base + out.offsets[i], out.lengths[i]);
      std::string what = "bad data CRC in a record of " + std::to_string(out.lengths[i]) + " bytes: stored " +
                         hex32(stored_crcs_[i]) + ", computed " + hex32(computed);
      const int64_t at = static_cast<int64_t>(out.file_offsets[i]);
      if (opts_.on_error == OnError::Raise) {
        // Deliver records [0, i) now; the error comes with the next call. An error found while
        // framing later records is superseded: this one comes first in the file.
        pending_error_ = std::make_exception_ptr(located_error(ErrorKind::Corrupt, path(out.file_index), at, what));
        for (size_t j = i; j < n; ++j) out.payload_bytes -= out.lengths[j];
        keep = i;
        break;
      }
      skip_or_raise(out.file_index, at, what);
      out.payload_bytes -= out.lengths[i];
      continue;
    }
    out.offsets[keep] = out.offsets[i];
    out.lengths[keep] = out.lengths[i];
    out.file_offsets[keep] = out.file_offsets[i];
    ++keep;
  }
  out.offsets.resize(keep);
  out.lengths.resize(keep);
  out.file_offsets.resize(keep);
}

void RecordScanner::skip_or_raise(size_t file_index, int64_t offset, const std::string& what) {
  if (opts_.on_error == OnError::Raise) throw_error(ErrorKind::Corrupt, path(file_index), offset, what);
  ++stats_.skipped;
  if (stats_.corruptions.size() < kMaxReports) stats_.corruptions.push_back({file_index, offset, what});
}

RecordScanner::Parse RecordScanner::corrupt(int64_t offset, const std::string& what, size_t step) {
  // step == 0: the framing is lost; move on byte by byte (4 for RecordIO) until a header checks.
  if (!resyncing_) skip_or_raise(region_.file_index, offset, what);
  assembling_ = false;  // a multi-part record being assembled is lost with its damaged part
  if (step == 0) {
    resyncing_ = true;
    region_.pos += opts_.format == Format::TFRecord ? 1 : 4;
  } else {
    region_.pos += step;
  }
  return Parse::Skipped;
}

RecordScanner::Parse RecordScanner::parse_tfrecord(Frame& f) {
  const size_t avail = region_.len - region_.pos;
  const uint8_t* p = region_.base + region_.pos;
  const uint64_t at = region_.base_offset + region_.pos;
  f.needed = 0;
  if (avail < kTFHeader) return Parse::Incomplete;
  const uint64_t length = le64(p);
  bool length_checked = false;
  if (opts_.verify) {
    uint32_t stored = le32(p + 8), computed = masked_crc32c(p, 8);
    if (stored != computed) {
      if (resyncing_) {
        ++region_.pos;
        return Parse::Skipped;
      }
      return corrupt(at, "bad length CRC: stored " + hex32(stored) + ", computed " + hex32(computed) +
                             " (length field reads " + std::to_string(length) + ")", 0);
    }
    length_checked = true;
  }
  if (region_.file_size != kUnknownSize) {
    const uint64_t rest = region_.file_size - at;
    if (length > rest || kTFHeader + kTFFooter + length > rest) {
      if (resyncing_) {
        ++region_.pos;
        return Parse::Skipped;
      }
      return corrupt(at, truncated_record_words(Format::TFRecord, length, rest, length_checked), 0);
    }
  } else if (length > opts_.max_record_bytes) {
    return corrupt(at, "record length " + std::to_string(length) + " exceeds max_record_bytes (" +
                           std::to_string(opts_.max_record_bytes) + ")", 0);
  }
  const uint64_t frame = kTFHeader + length + kTFFooter;
  if (avail < frame) {
    f.needed = frame;
    return Parse::Incomplete;
  }
  resyncing_ = false;
  if (opts_.verify) f.stored_crc = le32(p + kTFHeader + length);  // checked per batch: verify_batch
  f.data_off = region_.pos + kTFHeader;
  f.data_len = length;
  f.frame_len = frame;
  return Parse::Complete;
}

RecordScanner::Parse RecordScanner::parse_recordio(Frame& f) {
  const size_t avail = region_.len - region_.pos;
  const uint8_t* p = region_.base + region_.pos;
  const uint64_t at = region_.base_offset + region_.pos;
  f.needed = 0;
  if (avail < kRIOHeader) return Parse::Incomplete;
  const uint32_t magic = le32(p);
  if (magic != kRecordIOMagic) {
    if (resyncing_) {
      region_.pos += 4;
      return Parse::Skipped;
    }
    return corrupt(at, "bad RecordIO magic " + hex32(magic) + " (expected " + hex32(kRecordIOMagic) + ")", 0);
  }
  const uint32_t lrec = le32(p + 4);
  const uint32_t cflag = lrec >> 29;
  const uint64_t length = lrec & ((1u << 29) - 1);
  if (cflag > 3) {
    if (resyncing_) {
      region_.pos += 4;
      return Parse::Skipped;
    }
    return corrupt(at, "bad RecordIO part flag " + std::to_string(cflag) + " (0..3 are defined)", 0);
  }
  uint64_t frame = kRIOHeader + ((length + 3) & ~uint64_t(3));
  if (region_.file_size != kUnknownSize) {
    const uint64_t rest = region_.file_size - at;
    if (kRIOHeader + length > rest) {
      if (resyncing_) {
        region_.pos += 4;
        return Parse::Skipped;
      }
      return corrupt(at, truncated_record_words(Format::RecordIO, length, rest, true), 0);
    }
    if (frame > rest) frame = rest;  // tolerate a last record written without its padding
  }
  if (avail < frame) {
    f.needed = frame;
    return Parse::Incomplete;
  }
  resyncing_ = false;
  f.data_off = region_.pos + kRIOHeader;
  f.data_len = length;
  f.frame_len = frame;
  f.cflag = cflag;
  return Parse::Complete;
}

bool RecordScanner::pull_region() {
  if (pending_.valid) {
    region_ = pending_;
    pending_ = Region{};
    return true;
  }
  Chunk c;
  if (!src_.next(c)) return false;
  region_ = Region{};
  region_.owner = c.owner;
  region_.base = c.data;
  region_.len = c.len;
  region_.base_offset = c.offset;
  region_.file_size = c.file_size;
  region_.file_index = c.file_index;
  region_.last = c.last;
  region_.valid = true;
  region_.map = c.map;
  return true;
}

void RecordScanner::check_mapping() const {
  // A view of a file's mapping read ahead may outlive the file's bytes (cut short under the reader):
  // touching them would be a SIGBUS, so it is an I/O error naming the file, once per batch and region.
  if (region_.valid && region_.map && region_.pos < region_.len)
    region_.map->expect_holds(region_.base_offset + region_.pos, region_.len - region_.pos);
}

std::string truncated_header_words(uint64_t tail) {
  return "truncated record header: the file ends " + std::to_string(tail) + " bytes into a record header";
}

std::string truncated_record_words(Format format, uint64_t length, uint64_t rest, bool length_checked) {
  if (format == Format::RecordIO)
    return "truncated record: the header says " + std::to_string(length) + " bytes of data, but only " +
           std::to_string(rest) + " bytes remain in the file, header included";
  if (length_checked)
    return "truncated record: the header says " + std::to_string(length) + " bytes of data, but only " +
           std::to_string(rest) + " bytes remain in the file, header and CRCs included";
  return "record length " + std::to_string(length) + " is larger than the rest of the file (" +
         std::to_string(rest) + " bytes): the file is truncated or the length is corrupt";
}

void RecordScanner::truncated(const Frame& f) {
  const size_t tail = region_.len - region_.pos;
  const int64_t at = static_cast<int64_t>(region_.base_offset + region_.pos);
  std::string what =
      f.needed ? "truncated record: the frame needs " + std::to_string(f.needed) + " bytes but the file ends after " +
                     std::to_string(tail)
               : truncated_header_words(tail);
  if (!resyncing_) skip_or_raise(region_.file_index, at, what);
  region_.valid = false;
  resyncing_ = false;
  assembling_ = false;
}

void RecordScanner::extend_region(const Frame& f) {
  const size_t tail = region_.len - region_.pos;
  if (region_.last) {
    if (tail == 0) {
      region_.valid = false;
      resyncing_ = false;
      if (assembling_) {
        assembling_ = false;
        skip_or_raise(region_.file_index, static_cast<int64_t>(assembly_offset_),
                      "truncated multi-part RecordIO record: the file ends before its last part (cflag 3)");
      }
    } else {
      truncated(f);
    }
    return;
  }
  if (tail == 0) {
    region_.valid = false;
    return;
  }
  Chunk c;
  if (!src_.next(c) || c.file_index != region_.file_index)
    throw_error(ErrorKind::Generic, path(region_.file_index), -1, "internal: chunk stream ended inside a file");
  uint8_t* tail_ptr = region_.base + region_.pos;
  const uint64_t tail_off = region_.base_offset + region_.pos;
  auto adopt = [&](uint8_t* base, size_t len) {
    region_.owner = c.owner;
    region_.map = c.map;
    region_.base = base;
    region_.len = len;
    region_.pos = 0;
    region_.base_offset = tail_off;
    region_.last = c.last;
  };
  if (c.contiguous) {  // mmap: the tail is already right before the chunk
    adopt(c.data - tail, tail + c.len);  // probed as the batch goes on in it (next_batch_impl)
    return;
  }
  if (tail <= c.headroom) {  // move the record's start in front of the rest of it
    std::memcpy(c.data - tail, tail_ptr, tail);
    stats_.moved_bytes += tail;
    adopt(c.data - tail, tail + c.len);
    return;
  }
  // A frame larger than the headroom: its header is complete (headroom >= 64 KiB), so its size is
  // known and was checked against the file size; assemble it apart, growing only with real bytes.
  const uint64_t need = f.needed;
  if (need <= tail)
    throw_error(ErrorKind::Generic, path(region_.file_index), static_cast<int64_t>(tail_off),
                "internal: incomplete frame with a complete tail");
  auto spill = std::make_shared<AlignedBuffer>(static_cast<size_t>(std::min<uint64_t>(need, tail + c.len)));
  std::memcpy(spill->data(), tail_ptr, tail);
  size_t have = tail, used = 0;
  for (;;) {
    size_t take = static_cast<size_t>(std::min<uint64_t>(need - have, c.len - used));
    if (have + take > spill->size())
      spill->reserve(static_cast<size_t>(std::min<uint64_t>(need, std::max(have + take, 2 * spill->size()))), have);
    std::memcpy(spill->data() + have, c.data + used, take);
    have += take;
    used += take;
    if (have == need) break;
    if (c.last) {  // only where the file size is unknown (compressed): it was checked otherwise
      region_.base_offset = tail_off;
      region_.len = have;
      region_.pos = 0;
      region_.last = true;
      truncated(f);
      return;
    }
    if (!src_.next(c) || c.file_index != region_.file_index)
      throw_error(ErrorKind::Generic, path(region_.file_index), -1, "internal: chunk stream ended inside a file");
    used = 0;
  }
  ++stats_.spilled_records;
  pending_ = Region{};
  pending_.owner = c.owner;
  pending_.base = c.data + used;
  pending_.len = c.len - used;
  pending_.base_offset = c.offset + used;
  pending_.file_size = region_.file_size;
  pending_.file_index = region_.file_index;
  pending_.last = c.last;
  pending_.valid = true;
  region_.owner = spill;
  region_.base = spill->data();
  region_.len = static_cast<size_t>(need);
  region_.pos = 0;
  region_.base_offset = tail_off;
  region_.last = false;
}

bool RecordScanner::take_part(const Frame& f, RecordBatch& out) {
  const uint8_t* d = region_.base + f.data_off;
  const uint64_t at = region_.base_offset + region_.pos - f.frame_len;
  if (!assembling_) {
    if (f.cflag != 1) {
      skip_or_raise(region_.file_index, static_cast<int64_t>(at),
                    "RecordIO continuation part (cflag " + std::to_string(f.cflag) + ") without a start part");
      return false;
    }
    assembling_ = true;
    assembly_ = std::make_shared<AlignedBuffer>(static_cast<size_t>(f.data_len + 64));
    assembly_len_ = 0;
    assembly_offset_ = at;
  }
  // Parts were split where the payload held the magic word; it goes back between them.
  size_t extra = (f.cflag == 3) ? 0 : 4;
  size_t need = assembly_len_ + f.data_len + extra;
  if (need > assembly_->size()) assembly_->reserve(std::max(need, 2 * assembly_->size()), assembly_len_);
  std::memcpy(assembly_->data() + assembly_len_, d, f.data_len);
  assembly_len_ += f.data_len;
  if (extra) {
    uint32_t m = kRecordIOMagic;
    std::memcpy(assembly_->data() + assembly_len_, &m, 4);
    assembly_len_ += 4;
    return false;
  }
  assembling_ = false;
  out.owner = assembly_;
  out.base = assembly_->data();
  out.region_len = assembly_len_;
  out.file_index = region_.file_index;
  out.offsets.push_back(0);
  out.lengths.push_back(assembly_len_);
  out.file_offsets.push_back(assembly_offset_);
  out.payload_bytes = assembly_len_;
  assembly_.reset();
  return true;
}

void RecordScanner::finish_batch(RecordBatch& out) {
  if (opts_.verify && opts_.format == Format::TFRecord && !stored_crcs_.empty()) verify_batch(out);
  stats_.records += out.size();
  stats_.payload_bytes += out.payload_bytes;
}

bool RecordScanner::next_batch(RecordBatch& out) {
  if (pending_error_) {
    std::exception_ptr e = pending_error_;
    pending_error_ = nullptr;
    std::rethrow_exception(e);
  }
  try {
    bool more = next_batch_impl(out);
    if (more && out.offsets.empty() && pending_error_) return next_batch(out);  // nothing good before it
    return more;
  } catch (const Error&) {
    if (out.offsets.empty() || stored_crcs_.size() != out.offsets.size()) throw;
    pending_error_ = std::current_exception();
    finish_batch(out);  // the records framed before the error, CRC-checked
    if (out.offsets.empty()) return next_batch(out);
    return true;
  }
}

bool RecordScanner::next_batch_impl(RecordBatch& out) {
  out.clear();
  out.paths = paths_;
  stored_crcs_.clear();
  const uint8_t* probed = nullptr;  // the region this batch last probed (mmap): a new or extended one is probed
  auto done = [&]() {
    finish_batch(out);
    return true;
  };
  for (;;) {
    if (!region_.valid && !pull_region()) {
      if (assembling_) {  // unreachable in practice: the last region of a file ends assembly
        assembling_ = false;
        skip_or_raise(paths_->size() - 1, static_cast<int64_t>(assembly_offset_),
                      "truncated multi-part RecordIO record at the end of the data");
      }
      return false;
    }
    if (!region_.valid) continue;
    if (region_.base != probed) {  // once per batch and region, as it is now (a resync stays in it)
      check_mapping();
      probed = region_.base;
    }
    Frame f;
    Parse r = parse(f);
    if (r == Parse::Skipped) continue;
    if (r == Parse::Complete) {
      if (opts_.format == Format::RecordIO && assembling_ && f.cflag <= 1) {
        // A plain record or a new start where a middle or end part belongs: the record being
        // assembled lost its end. Report it, then read this frame as the start of something new.
        assembling_ = false;
        skip_or_raise(region_.file_index, static_cast<int64_t>(assembly_offset_),
                      "multi-part RecordIO record has no end part: a cflag " + std::to_string(f.cflag) +
                          " frame follows at byte " + std::to_string(region_.base_offset + region_.pos));
      }
      if (opts_.format == Format::RecordIO && f.cflag != 0) {
        if (!out.offsets.empty()) return done();  // an assembled record travels in a batch of its own
        region_.pos += f.frame_len;
        if (take_part(f, out)) return done();
        continue;
      }
      if (out.offsets.empty()) {
        out.owner = region_.owner;
        out.base = region_.base;
        out.file_index = region_.file_index;
      }
      out.offsets.push_back(f.data_off);
      out.lengths.push_back(f.data_len);
      stored_crcs_.push_back(f.stored_crc);
      out.file_offsets.push_back(region_.base_offset + region_.pos);
      out.payload_bytes += f.data_len;
      region_.pos += f.frame_len;
      out.region_len = region_.pos;
      if (opts_.max_records && out.size() >= opts_.max_records) return done();
      continue;
    }
    // Incomplete: finish the batch before the region changes under it.
    if (!out.offsets.empty()) return done();
    extend_region(f);
  }
}

}  // namespace dlstore
