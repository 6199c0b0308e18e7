// Reads an epoch's read plan into host memory: the host executor of a ReadSchedule (read_schedule.hpp),
// which decides what is read together, what each batch takes and when memory is let go.
//
// A chunk's pieces are read on an I/O thread of its device, which also checks every frame. Batches are
// views into a chunk when all their records lie in one (no copy), else the records are gathered by copy
// into a reused buffer. Records the schedule spills are copied out of their chunk before it goes.
#pragma once

#include <cstdint>
#include <deque>
#include <future>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "dlstore/aligned_buffer.hpp"
#include "dlstore/engine.hpp"
#include "dlstore/published.hpp"
#include "dlstore/read_schedule.hpp"
#include "dlstore/record_scan.hpp"
#include "dlstore/thread_pool.hpp"

namespace dlstore {

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
  // Starts the first reads (up to the schedule's depth) without waiting for any: a reader made ahead of
  // its turn (the next window of a pass) has its reads in flight when the one before it ends.
  void start();
  // Ends the reads: those not started are dropped, those under way waited for up to the read timeout (the
  // GIL released), so that the files are closed when the reader goes; one still running then is abandoned.
  void close();
  // Emission positions consumed so far (records handed out, plus corrupt ones skipped).
  size_t position() const { return schedule_.position(); }
  size_t size() const { return schedule_.size(); }
  // As of the end of the last next_batch or start: safe to call from any thread, while another reads.
  PlanStats stats() const { return report_.stats(); }
  std::vector<std::string> notes() const { return report_.notes(); }
  std::vector<CorruptionReport> corruptions() const { return report_.corruptions(); }
  const std::vector<std::string>& paths() const { return schedule_.plan().paths; }
  void publish() noexcept;  // the reading thread's: copies the live counters into the report

  struct Loaded;    // a chunk's bytes and its records' payloads, as an I/O task returns them
  struct Progress;  // what an I/O task is doing, for a timeout's message

 private:
  void submit(size_t chunk);
  Arrival wait(size_t chunk);
  void spill(size_t chunk, const std::vector<int64_t>& positions);
  const uint8_t* data_of(int64_t pos, int64_t chunk, uint64_t* len) const;
  void build(const Step& batch, RecordBatch& out);

  ReadSchedule schedule_;
  PlanOptions opts_;
  std::shared_ptr<FileCache> files_;
  std::shared_ptr<BufferPool> chunk_pool_;
  std::shared_ptr<BufferPool> batch_pool_;
  std::vector<std::unique_ptr<ThreadPool>> threads_;  // per device
  std::vector<std::unique_ptr<Loaded>> loaded_;       // per chunk, while held
  struct InFlight {
    size_t chunk;
    std::future<std::unique_ptr<Loaded>> result;
    std::shared_ptr<Progress> progress;
  };
  std::deque<InFlight> inflight_;
  // Records the schedule spilled: copies (and lengths), until they are handed out.
  std::unordered_map<int64_t, std::pair<std::shared_ptr<AlignedBuffer>, uint64_t>> spilled_;
  bool abandoned_ = false;  // a read timed out: its thread may never return, so it is not joined
  std::unique_ptr<Step> pending_;  // the step start() stopped at, carried out first by next_batch()
  PlanStats moved_;         // the executor's counters: records and payload handed out, gathered and spilled bytes
  Published<PlanStats> report_;
};

}  // namespace dlstore
