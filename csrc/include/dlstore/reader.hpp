// A record reader over a list of files: engine -> (inflate) -> record framing, in one object.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "dlstore/compression.hpp"
#include "dlstore/engine.hpp"
#include "dlstore/published.hpp"
#include "dlstore/record_scan.hpp"

namespace dlstore {

struct ReaderOptions {
  EngineOptions engine;
  size_t headroom = 0;  // space before each chunk that joins a record split across two reads (ChunkReader)
  ScanOptions scan;
  std::vector<Compression> compression;  // one per file; empty: none for all
  std::vector<ByteRange> ranges;         // one per file; empty: every file whole
};

struct ReaderStats {
  uint64_t records = 0;
  uint64_t payload_bytes = 0;
  uint64_t file_bytes_read = 0;
  uint64_t cache_bytes_read = 0;  // of those, O_DIRECT files' bytes read from the page cache
  uint64_t skipped = 0;
  uint64_t moved_bytes = 0;
  uint64_t spilled_records = 0;
  size_t buffers_allocated = 0;
};

class Reader {
 public:
  Reader(std::vector<std::string> paths, ReaderOptions opts);
  bool next_batch(RecordBatch& out);
  void close() { chunks_->close(); }  // ChunkReader::close
  // As of the end of the last next_batch: safe to call from any thread, while another reads.
  ReaderStats stats() const { return report_.stats(); }
  std::vector<std::string> notes() const { return report_.notes(); }
  std::vector<CorruptionReport> corruptions() const { return report_.corruptions(); }
  const std::vector<std::string>& paths() const { return *paths_; }
  void publish() noexcept;  // the reading thread's: copies the live counters into the report

 private:
  ReaderStats live_stats() const;
  Published<ReaderStats> report_;
  std::shared_ptr<const std::vector<std::string>> paths_;
  std::unique_ptr<ChunkReader> chunks_;
  std::unique_ptr<InflateStream> inflate_;
  std::unique_ptr<RecordScanner> scanner_;
};

}  // namespace dlstore
