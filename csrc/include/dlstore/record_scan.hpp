// Splits chunks into records: TFRecord framing with CRC checks, MXNet RecordIO framing with
// multi-part records. Records are handed out in batches that point into the chunk buffers.
#pragma once

#include <cstdint>
#include <exception>
#include <memory>
#include <string>
#include <vector>

#include "dlstore/aligned_buffer.hpp"
#include "dlstore/engine.hpp"
#include "dlstore/frame_layout.hpp"
#include "dlstore/thread_pool.hpp"

namespace dlstore {

enum class Format { TFRecord, RecordIO };
Format parse_format(const std::string& name);

enum class OnError { Raise, Skip };


struct ScanOptions {
  Format format = Format::TFRecord;
  bool verify = true;           // check TFRecord CRCs
  OnError on_error = OnError::Raise;
  size_t max_records = 0;       // per batch; 0: as many as one chunk holds
  // Upper bound for one record when the file size is unknown (compressed files): a hostile length
  // field is refused before it can cause a large allocation.
  uint64_t max_record_bytes = uint64_t(1) << 31;
  // Threads besides the caller that check data CRCs of a batch (0: the caller alone); set from
  // dlstore/settings.py through the binding.
  size_t verify_threads = 0;
};

// Records lie in one contiguous region: record i is base[offsets[i] .. offsets[i]+lengths[i]).
struct RecordBatch {
  std::shared_ptr<void> owner;
  const uint8_t* base = nullptr;
  size_t region_len = 0;
  size_t file_index = 0;               // the file of every record, unless file_indices says otherwise
  std::vector<uint64_t> offsets, lengths;
  std::vector<uint64_t> file_offsets;  // where each record's frame starts in its file
  std::vector<uint64_t> file_indices;  // per record, when a batch gathers records of several files
  // The reader's file list, which file_index and file_indices point into; shared, so a batch can name
  // its records' files after the reader is gone.
  std::shared_ptr<const std::vector<std::string>> paths;
  uint64_t payload_bytes = 0;
  size_t size() const { return offsets.size(); }
  size_t file_of(size_t i) const { return file_indices.empty() ? file_index : file_indices[i]; }
  void clear();
};

struct CorruptionReport {
  size_t file_index;
  int64_t offset;
  std::string what;
};

struct ScanStats {
  uint64_t records = 0;
  uint64_t payload_bytes = 0;
  uint64_t skipped = 0;          // corrupt records skipped under OnError::Skip
  uint64_t moved_bytes = 0;      // bytes moved into headroom to join records across chunks
  uint64_t spilled_records = 0;  // records too large for headroom, assembled apart
  std::vector<CorruptionReport> corruptions;  // first kMaxReports, under OnError::Skip
};

// The words for a file cut inside its last record, said alike by the scanner and by check_frame (an
// indexed frame that runs to the end of its file): the file ends `tail` bytes into a record header; or a
// header says `length` bytes of data where `rest` bytes of the file remain (`length_checked`: its CRC
// held, so the file is short, rather than the length corrupt).
std::string truncated_header_words(uint64_t tail);
std::string truncated_record_words(Format format, uint64_t length, uint64_t rest, bool length_checked);

class RecordScanner {
 public:
  RecordScanner(ChunkStream& src, std::shared_ptr<const std::vector<std::string>> paths, ScanOptions opts);
  // Fills `out` with the next records; false when every file is consumed. Under OnError::Raise the
  // good records before a corrupt one are delivered first, and the error is raised by the next call.
  bool next_batch(RecordBatch& out);
  const ScanStats& stats() const { return stats_; }
  static constexpr size_t kMaxReports = 10000;

 private:
  struct Region {
    std::shared_ptr<void> owner;
    uint8_t* base = nullptr;
    size_t len = 0;
    size_t pos = 0;
    uint64_t base_offset = 0;  // file offset of base[0]
    uint64_t file_size = kUnknownSize;
    size_t file_index = 0;
    bool last = false;         // no more bytes of this file after this region
    bool valid = false;
    const Mapping* map = nullptr;  // the mapping base lies in (mmap): checked before a batch reads it
  };
  enum class Parse { Complete, Incomplete, Skipped };
  struct Frame {
    uint64_t data_off = 0;  // relative to region base
    uint64_t data_len = 0;
    uint64_t frame_len = 0;
    uint32_t cflag = 0;
    uint32_t stored_crc = 0;  // TFRecord data CRC as stored
    uint64_t needed = 0;    // for Incomplete: frame bytes needed, 0 when the header is incomplete
  };
  Parse parse_tfrecord(Frame& f);
  Parse parse_recordio(Frame& f);
  Parse parse(Frame& f) {
    return opts_.format == Format::TFRecord ? parse_tfrecord(f) : parse_recordio(f);
  }
  // Raises under OnError::Raise; otherwise counts the skip and keeps its report.
  void skip_or_raise(size_t file_index, int64_t offset, const std::string& what);
  // A corruption at the current position: raise, or record it and resynchronise.
  Parse corrupt(int64_t offset, const std::string& what, size_t resync_step);
  bool pull_region();
  void extend_region(const Frame& f);
  void truncated(const Frame& f);  // raises, or under OnError::Skip records it and drops the tail
  void check_mapping() const;      // raises when the region's file no longer holds its bytes (mmap)
  bool take_part(const Frame& f, RecordBatch& out);
  bool next_batch_impl(RecordBatch& out);
  // Checks the data CRCs of the batch's records (deferred from framing), on several threads.
  void verify_batch(RecordBatch& out);
  void finish_batch(RecordBatch& out);
  const std::string& path(size_t i) const { return (*paths_)[i]; }

  ChunkStream& src_;
  std::shared_ptr<const std::vector<std::string>> paths_;
  ScanOptions opts_;
  ScanStats stats_;
  std::unique_ptr<ThreadPool> verifiers_;
  std::vector<uint32_t> stored_crcs_;  // per record of the batch being built
  std::exception_ptr pending_error_;   // raised by the next call, after the good records
  Region region_;
  Region pending_;  // what is left of a chunk after a record was assembled apart
  bool resyncing_ = false;
  // RecordIO multi-part assembly.
  bool assembling_ = false;
  std::shared_ptr<AlignedBuffer> assembly_;
  size_t assembly_len_ = 0;
  uint64_t assembly_offset_ = 0;
};

}  // namespace dlstore
