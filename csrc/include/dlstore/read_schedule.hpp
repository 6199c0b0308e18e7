// The logic of reading an epoch's read plan, apart from where the bytes land: which byte ranges are
// read together (chunks of pieces), how many reads are in flight, which records each batch takes in
// emission order, when a chunk may be let go, when a chunk held too long has its last records copied
// out (spilled), resume positions (a short first batch) and what a corrupt record or a failed read
// does. One implementation for every destination: the host engines' PlanReader (plan_reader.hpp)
// and the GPU reader (dlstore/io/gds) are executors that carry out its steps.
//
// The executor asks for the next Step and carries it out: Read (start reading a chunk's pieces), Wait
// (wait for the chunk that arrives next and report what its frames said with arrived()), Spill (copy
// the named records out of a chunk about to be let go), Release (let a chunk go) and Batch (hand out
// these records, in this order). next() raises the error a record of the plan meets, once the good
// records before it have gone out.
#pragma once

#include <cstdint>
#include <deque>
#include <exception>
#include <memory>
#include <set>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "dlstore/record_scan.hpp"

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

struct ScheduleOptions {
  uint64_t chunk_size = 8u << 20;  // bytes of records read together
  size_t depth = 1;                // chunks in flight
  size_t batch_size = 1;
  size_t first_batch = 0;          // records of the first batch (a plan restarted mid-batch); 0: batch_size
  // Bytes of arrived chunks kept for a reordering emission before the oldest are let go (their
  // remaining records spilled); 0: no limit.
  uint64_t hold_bytes = 0;
  OnError on_error = OnError::Raise;
  // Distinct files a chunk reads, at most (0: no limit): an executor holds every file of a chunk open
  // while it reads it, and a global shuffle of small records puts thousands in 8 MiB. A chunk that
  // must hold whole batches still takes at least one.
  size_t max_chunk_files = 0;
};

// The counters of a pass. The schedule keeps those it decides; an executor adds the bytes it moves.
struct PlanStats {
  uint64_t records = 0;          // emitted (PlanReader: those of the batches it built)
  uint64_t payload_bytes = 0;    // executor
  uint64_t file_bytes_read = 0;  // bytes read from files (O_DIRECT from the device: whole aligned blocks)
  uint64_t cache_bytes_read = 0;  // of those, read by an O_DIRECT engine from the page cache, which held them
  uint64_t skipped = 0;          // corrupt records skipped under OnError::Skip
  uint64_t chunks = 0;           // chunks read
  uint64_t gathered_batches = 0;  // executor: batches whose records were copied together
  uint64_t gathered_bytes = 0;    // executor
  uint64_t spilled_records = 0;  // records copied out of a chunk let go before they were emitted
  uint64_t spilled_bytes = 0;    // executor
  uint64_t peak_held_bytes = 0;  // the most chunk bytes held at once
  size_t buffers_allocated = 0;  // executor
};

// A run of read positions [first, last) whose frames follow each other in one file: bytes [start, end).
struct Piece {
  size_t first, last;
  uint32_t file;
  uint64_t start, end;
};

// What the executor found when a chunk arrived.
struct Arrival {
  uint64_t bytes_read = 0;  // from files
  uint64_t cache_bytes_read = 0;  // of those, from the page cache where the engine reads O_DIRECT
  uint64_t held_bytes = 0;  // memory held for the chunk until it is released (0: views of a file mapping)
  // Corrupt records: read position, where in the file the problem is, and what it is.
  std::vector<int64_t> bad;
  std::vector<uint64_t> bad_at;
  std::vector<std::string> bad_what;
  // A file that would not open or read: the records from read position `failed_from` on are not there.
  std::exception_ptr failure;
  size_t failed_from = 0;
};

struct Step {
  enum class Kind { Read, Wait, Spill, Release, Batch, End };
  Kind kind = Kind::End;
  size_t chunk = 0;                // Read, Wait, Spill, Release
  std::vector<int64_t> positions;  // Spill: records to copy out; Batch: the batch, in emission order
  std::vector<int64_t> chunks;     // Batch: per record its chunk, or -1 when it was spilled
};

class ReadSchedule {
 public:
  ReadSchedule(ReadPlan plan, ScheduleOptions opts);

  // The next step (see the top of this file). Raises the error of a record the plan reached, once the
  // batch of the good records before it went out.
  Step next();
  // Reports the chunk the last Wait named. Corrupt records are dealt with when their turn comes.
  void arrived(size_t chunk, Arrival a);

  // The chunk's records to read, neighbours in one file joined.
  std::vector<Piece> pieces(size_t chunk) const;
  size_t num_chunks() const { return left_.size(); }
  // The device (mount) a chunk is read from: it is cut where the device changes.
  uint32_t chunk_device(size_t chunk) const { return chunk_device_[chunk]; }
  uint32_t num_devices() const { return devices_; }

  // Emission positions consumed so far (records handed out, plus corrupt ones skipped).
  size_t position() const { return k_; }
  size_t size() const { return n_emit_; }
  const ReadPlan& plan() const { return *plan_; }
  std::shared_ptr<const ReadPlan> shared_plan() const { return plan_; }
  std::shared_ptr<const std::vector<std::string>> shared_paths() const { return paths_; }
  PlanStats stats() const { return stats_; }
  const std::vector<CorruptionReport>& corruptions() const { return corruptions_; }

 private:
  int64_t emit_at(size_t k) const { return emit_.empty() ? static_cast<int64_t>(k) : emit_[k]; }
  size_t chunk_of(int64_t pos) const;
  void plan_chunks(const std::vector<uint8_t>& needed);
  bool next_read(Step& s);
  void release(size_t chunk);
  void spill_oldest();
  void done_with(int64_t pos);
  Step take_batch();

  std::shared_ptr<const ReadPlan> plan_;
  std::shared_ptr<const std::vector<std::string>> paths_;
  ScheduleOptions opts_;
  std::vector<int64_t> emit_;
  size_t n_emit_ = 0;
  size_t k_ = 0;

  // Chunk c holds read positions [begin_[c], begin_[c + 1]), of which those flagged in `needed_` are
  // emitted (all, unless a resumed emission order leaves some out); `left_[c]` are still to be.
  std::vector<size_t> begin_;
  std::vector<uint32_t> left_;
  std::vector<uint8_t> needed_;
  std::vector<uint8_t> done_;    // per read position: emitted (or skipped)
  std::vector<uint64_t> held_;   // per chunk: bytes held (arrived, not let go)
  std::vector<uint8_t> holding_;  // per chunk: arrived and not let go
  std::vector<uint32_t> chunk_device_;
  uint32_t devices_ = 1;
  std::vector<int64_t> picked_;  // the batch being built
  size_t want_ = 0;              // its size
  bool building_ = false;        // a batch is under way (next() returned a Wait while building it)
  struct Corrupt {
    uint64_t offset;
    std::string what;
  };
  std::unordered_map<int64_t, Corrupt> bad_;  // corrupt records of the chunks arrived, by read position
  // Chunks cut short by a file that would not open or read: from which read position, and why.
  std::unordered_map<size_t, std::pair<size_t, std::exception_ptr>> failures_;
  std::unordered_set<int64_t> spilled_;  // records copied out of chunks let go, until emitted
  std::deque<size_t> arrived_order_;  // chunks held, oldest first
  uint64_t held_bytes_ = 0;
  size_t next_schedule_ = 0;   // the next chunk to read
  std::deque<size_t> inflight_;  // chunks being read, in the order they arrive
  size_t next_arrive_ = 0;     // chunks before this one have arrived
  bool waiting_ = false;       // a Wait was handed out and arrived() is due
  std::deque<Step> queued_;    // Spill and Release steps, handed out before anything else
  std::exception_ptr pending_error_;
  std::vector<CorruptionReport> corruptions_;
  // (file, frame offset) of the corrupt records skipped: a record the plan reads again (remainder="pad"
  // wraps around) is one record skipped, counted and reported once.
  std::set<std::pair<uint32_t, uint64_t>> skipped_frames_;
  PlanStats stats_;
};

}  // namespace dlstore
