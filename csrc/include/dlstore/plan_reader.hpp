// Reads an epoch's read plan: records an index located, read in planned order with large reads and
// several in flight, handed out in batches of exactly batch_size records in the planned emission order.
//
// The plan crosses into C++ once, as arrays: per record (its *read position*) the file, the frame's
// offset and its size, in the order the records are read; and, when records are emitted in another
// order than they are read (a shuffle buffer), that emission order. Neighbouring records are read
// together: a *chunk* is a run of read positions of about chunk_size bytes whose records are read with
// one read per contiguous piece, on an I/O thread that also checks every frame. Batches are views into
// a chunk when all their records lie in one (no copy), else the records are gathered by copy into a
// reused buffer. Chunks still holding records not yet emitted are kept; under a reordering emission
// the oldest are let go past `hold_bytes`, their last records copied out first, so a record lingering
// in a shuffle buffer never pins a whole chunk.
#pragma once

#include <cstdint>
#include <deque>
#include <exception>
#include <future>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "dlstore/aligned_buffer.hpp"
#include "dlstore/engine.hpp"
#include "dlstore/record_scan.hpp"
#include "dlstore/thread_pool.hpp"

namespace dlstore {

struct ReadPlan {
  std::vector<std::string> paths;
  // Per file: the device it lies on (a mount point). Each device has threads of its own, so that a
  // slow one cannot hold the threads the others need; empty: one for all.
  std::vector<uint32_t> device;
  std::vector<uint32_t> file;    // per read position: index into paths
  std::vector<uint64_t> offset;  // where the record's frame starts in its file
  std::vector<uint64_t> size;    // the frame's bytes (header, payload, footer; every RecordIO part)
  std::vector<int64_t> emit;     // read positions in emission order (each at most once); empty: read order
};

struct PlanOptions {
  EngineOptions engine;          // engine, chunk_size, depth, threads (per device), timeout_s, queue_depth
  Format format = Format::TFRecord;
  bool verify = true;
  OnError on_error = OnError::Raise;
  size_t batch_size = 1;
  size_t first_batch = 0;        // records of the first batch (a plan restarted mid-batch); 0: batch_size
  // Bytes of arrived chunks kept for a reordering emission before the oldest are let go (their
  // remaining records copied out); 0: no limit.
  uint64_t hold_bytes = 0;
  bool sequential = true;        // mmap access advice: reads mostly in file order
  size_t max_open_files = 1024;  // descriptors and mappings kept open at once (least recently used go)
};

struct PlanStats {
  uint64_t records = 0;          // emitted
  uint64_t payload_bytes = 0;
  uint64_t file_bytes_read = 0;  // bytes read from files (direct: whole aligned blocks)
  uint64_t skipped = 0;          // corrupt records skipped under OnError::Skip
  uint64_t chunks = 0;           // chunks read
  uint64_t gathered_batches = 0;  // batches whose records were copied together
  uint64_t gathered_bytes = 0;
  uint64_t spilled_records = 0;  // records copied out of a chunk let go before they were emitted
  uint64_t spilled_bytes = 0;
  uint64_t peak_held_bytes = 0;  // the most chunk bytes held at once
  size_t buffers_allocated = 0;
};

class FileCache;

class PlanReader {
 public:
  PlanReader(ReadPlan plan, PlanOptions opts);
  ~PlanReader();
  PlanReader(const PlanReader&) = delete;
  PlanReader& operator=(const PlanReader&) = delete;

  // The next batch: batch_size records (first_batch for the first; fewer only at the end of the plan,
  // or before a record that cannot be read or, under OnError::Raise, is corrupt: the next call raises
  // that error); false at the end.
  bool next_batch(RecordBatch& out);
  // Emission positions consumed so far (records handed out, plus corrupt ones skipped).
  size_t position() const { return k_; }
  size_t size() const { return n_emit_; }
  PlanStats stats() const;
  std::vector<std::string> notes() const;
  const std::vector<CorruptionReport>& corruptions() const { return corruptions_; }
  const std::vector<std::string>& paths() const { return plan_->paths; }

  struct Loaded;    // a chunk's bytes and its records' payloads, as an I/O task returns them
  struct Progress;  // what an I/O task is doing, for a timeout's message

 private:
  int64_t emit_at(size_t k) const { return emit_.empty() ? static_cast<int64_t>(k) : emit_[k]; }
  size_t chunk_of(int64_t pos) const;
  void plan_chunks();
  void fill();
  void arrive();
  void ensure(size_t chunk);
  void release(size_t chunk);
  void spill_oldest();
  void done_with(int64_t pos);
  const uint8_t* data_of(int64_t pos, uint64_t* len) const;
  void build(RecordBatch& out);

  std::shared_ptr<const ReadPlan> plan_;
  std::shared_ptr<const std::vector<std::string>> paths_;
  PlanOptions opts_;
  std::vector<int64_t> emit_;
  size_t n_emit_ = 0;
  size_t k_ = 0;

  // Chunks: chunk c holds read positions [begin_[c], begin_[c + 1]), of which those flagged in
  // `needed_` are emitted (all, unless a resumed emission order leaves some out); `left_[c]` of them
  // are still to be. The I/O tasks share the (immutable) flags.
  std::vector<size_t> begin_;
  std::vector<uint32_t> left_;
  std::shared_ptr<const std::vector<uint8_t>> needed_;
  std::vector<uint8_t> done_;    // per read position: emitted (or skipped)
  std::vector<std::unique_ptr<Loaded>> loaded_;  // per chunk, while held
  std::vector<int64_t> picked_;  // the batch being built
  struct Corrupt {
    uint64_t offset;
    std::string what;
  };
  std::unordered_map<int64_t, Corrupt> bad_;  // corrupt records of the chunks arrived, by read position
  // Chunks cut short by a file that would not open or read: from which read position, and why.
  std::unordered_map<size_t, std::pair<size_t, std::exception_ptr>> failures_;
  std::deque<size_t> held_;      // arrived chunks not yet let go, oldest first
  uint64_t held_bytes_ = 0;
  size_t next_schedule_ = 0;     // the next chunk to queue a read for
  size_t next_arrive_ = 0;       // the next chunk whose read is taken from the queue
  struct InFlight {
    size_t chunk;
    std::future<std::unique_ptr<Loaded>> result;
    std::shared_ptr<Progress> progress;
  };
  std::deque<InFlight> inflight_;
  // Records whose chunk was let go before they were emitted: copies (and lengths), until emitted.
  std::unordered_map<int64_t, std::pair<std::shared_ptr<AlignedBuffer>, uint64_t>> spilled_;

  std::shared_ptr<FileCache> files_;
  std::shared_ptr<BufferPool> chunk_pool_;
  std::shared_ptr<BufferPool> batch_pool_;
  std::vector<size_t> chunk_device_;  // the device of each chunk's first record
  std::vector<std::unique_ptr<ThreadPool>> threads_;  // per device
  std::exception_ptr pending_error_;
  bool abandoned_ = false;  // a read timed out: its thread may never return, so it is not joined
  std::vector<CorruptionReport> corruptions_;
  PlanStats stats_;
};

}  // namespace dlstore
