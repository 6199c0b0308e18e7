#include "dlstore/read_schedule.hpp"

#include <algorithm>

#include "dlstore/error.hpp"

namespace dlstore {

ReadSchedule::ReadSchedule(ReadPlan plan, ScheduleOptions opts) : opts_(opts) {
  const size_t n = plan.file.size();
  DLSTORE_EXPECT(plan.offset.size() == n && plan.size.size() == n, Generic, "", -1,
                 "internal: a read plan needs as many offsets (" << plan.offset.size() << ") and sizes ("
                                                                 << plan.size.size() << ") as files (" << n << ")");
  DLSTORE_EXPECT(plan.device.empty() || plan.device.size() == plan.paths.size(), Generic, "", -1,
                 "internal: " << plan.device.size() << " devices for " << plan.paths.size() << " files");
  for (size_t i = 0; i < n; ++i)
    DLSTORE_EXPECT(plan.file[i] < plan.paths.size(), Generic, "", -1,
                   "internal: read position " << i << " names file " << plan.file[i] << " of "
                                              << plan.paths.size());
  if (opts_.batch_size == 0) opts_.batch_size = 1;
  if (opts_.depth == 0) opts_.depth = 1;
  emit_ = std::move(plan.emit);
  // Which read positions are emitted: all of them, in read order, unless an emission order says.
  needed_.assign(n, emit_.empty() ? 1 : 0);
  for (int64_t pos : emit_) {
    DLSTORE_EXPECT(pos >= 0 && static_cast<size_t>(pos) < n, Generic, "", -1,
                   "internal: the emission order names read position " << pos << " of " << n);
    DLSTORE_EXPECT(needed_[pos] == 0, Generic, "", -1,
                   "internal: the emission order names read position " << pos << " twice");
    needed_[pos] = 1;
  }
  done_.assign(n, 0);
  n_emit_ = emit_.empty() ? n : emit_.size();
  plan_ = std::make_shared<const ReadPlan>(std::move(plan));
  // The plan's file list, shared with the batches (which name their records' files): a pointer into
  // the plan that keeps the plan alive, not a copy.
  paths_ = std::shared_ptr<const std::vector<std::string>>(plan_, &plan_->paths);
  plan_chunks(needed_);
  // A chunk is read by its device's threads; chunks are cut where the device changes (under a
  // reordering emission), elsewhere a chunk goes to its first record's device.
  const std::vector<uint32_t>& device = plan_->device;
  for (uint32_t d : device) devices_ = std::max<uint32_t>(devices_, d + 1);
  chunk_device_.assign(left_.size(), 0);
  if (!device.empty())
    for (size_t c = 0; c < left_.size(); ++c)
      if (begin_[c] < plan_->file.size()) chunk_device_[c] = device[plan_->file[begin_[c]]];
  held_.assign(left_.size(), 0);
  holding_.assign(left_.size(), 0);
}

void ReadSchedule::plan_chunks(const std::vector<uint8_t>& needed) {
  const ReadPlan& plan = *plan_;
  const size_t n = plan.file.size();
  const uint64_t limit = opts_.chunk_size;
  begin_.assign(1, 0);
  left_.clear();
  uint64_t bytes = 0;
  uint32_t count = 0;
  // The distinct files of the chunk being formed: in_chunk[f] == chunk_mark for each of them.
  const size_t cap = opts_.max_chunk_files;
  std::vector<uint32_t> in_chunk(cap ? plan.paths.size() : 0, 0);
  uint32_t chunk_mark = 1;
  size_t files = 0;
  auto cut = [&](size_t at) {
    begin_.push_back(at);
    left_.push_back(count);
    bytes = 0;
    count = 0;
    ++chunk_mark;
    files = 0;
  };
  if (emit_.empty()) {
    // Read order is emission order: chunks end on batch boundaries, so every batch lies in one chunk
    // and is handed out as a view. A chunk takes whole batches up to chunk_size (at least one).
    const size_t batch = opts_.batch_size;
    const size_t head = opts_.first_batch > 0 ? std::min(opts_.first_batch, batch) : batch;
    std::vector<uint32_t> in_batch(cap ? plan.paths.size() : 0, 0);
    uint32_t batch_mark = 0;
    for (size_t first = 0; first < n; first += (first == 0 ? head : batch)) {
      const size_t last = std::min(n, first + (first == 0 ? head : batch));
      uint64_t batch_bytes = 0;
      for (size_t i = first; i < last; ++i) batch_bytes += plan.size[i];
      size_t distinct = 0, fresh = 0;  // the batch's files, and those the chunk does not read yet
      if (cap) {
        ++batch_mark;
        for (size_t i = first; i < last; ++i) {
          const uint32_t f = plan.file[i];
          if (in_batch[f] == batch_mark) continue;
          in_batch[f] = batch_mark;
          ++distinct;
          if (in_chunk[f] != chunk_mark) ++fresh;
        }
      }
      if (count > 0 && (bytes + batch_bytes > limit || (cap && files + fresh > cap))) {
        cut(first);
        fresh = distinct;
      }
      bytes += batch_bytes;
      count += static_cast<uint32_t>(last - first);
      if (cap) {
        files += fresh;
        for (size_t i = first; i < last; ++i) in_chunk[plan.file[i]] = chunk_mark;
      }
    }
  } else {
    // Records are gathered from the chunks held, so chunks follow the bytes only: needed records are
    // added while the chunk holds less than chunk_size (a block of about chunk_size is one read), and a
    // chunk ends where the device changes, so that each chunk is read through one mount.
    const std::vector<uint32_t>& device = plan.device;
    uint32_t current = 0;
    for (size_t i = 0; i < n; ++i) {
      if (!needed[i]) continue;
      const uint32_t d = device.empty() ? 0 : device[plan.file[i]];
      const uint32_t f = plan.file[i];
      const bool fresh = cap && in_chunk[f] != chunk_mark;
      if (count > 0 && (bytes >= limit || d != current || (fresh && files >= cap))) cut(i);
      if (cap && in_chunk[f] != chunk_mark) {
        in_chunk[f] = chunk_mark;
        ++files;
      }
      current = d;
      bytes += plan.size[i];
      ++count;
    }
  }
  if (count > 0 || begin_.size() == 1) cut(n);
  begin_.back() = n;  // the last chunk runs to the end of the plan (records past it are not needed)
}

std::vector<Piece> ReadSchedule::pieces(size_t chunk) const {
  const ReadPlan& plan = *plan_;
  const size_t b = begin_[chunk], e = begin_[chunk + 1];
  std::vector<Piece> out;
  size_t i = b;
  while (i < e) {
    if (needed_[i] == 0) {
      ++i;
      continue;
    }
    Piece p{i, i + 1, plan.file[i], plan.offset[i], plan.offset[i] + plan.size[i]};
    while (p.last < e && needed_[p.last] != 0 && plan.file[p.last] == p.file && plan.offset[p.last] == p.end) {
      p.end += plan.size[p.last];
      ++p.last;
    }
    out.push_back(p);
    i = p.last;
  }
  return out;
}

size_t ReadSchedule::chunk_of(int64_t pos) const {
  return static_cast<size_t>(std::upper_bound(begin_.begin(), begin_.end(), static_cast<size_t>(pos)) -
                             begin_.begin()) - 1;
}

bool ReadSchedule::next_read(Step& s) {
  while (inflight_.size() < opts_.depth && next_schedule_ < left_.size()) {
    const size_t c = next_schedule_++;
    if (left_[c] == 0) continue;  // nothing in it is emitted (a resumed plan)
    inflight_.push_back(c);
    s.kind = Step::Kind::Read;
    s.chunk = c;
    return true;
  }
  return false;
}

void ReadSchedule::arrived(size_t chunk, Arrival a) {
  DLSTORE_EXPECT(waiting_ && !inflight_.empty() && inflight_.front() == chunk, Generic, "", -1,
                 "internal: chunk " << chunk << " arrived, but the schedule waits for "
                                    << (inflight_.empty() ? std::string("none") : std::to_string(inflight_.front())));
  DLSTORE_EXPECT(a.bad.size() == a.bad_at.size() && a.bad.size() == a.bad_what.size(), Generic, "", -1,
                 "internal: " << a.bad.size() << " corrupt records with " << a.bad_at.size() << " offsets and "
                              << a.bad_what.size() << " descriptions");
  waiting_ = false;
  inflight_.pop_front();
  next_arrive_ = chunk + 1;
  if (a.failure) failures_[chunk] = {a.failed_from, a.failure};
  for (size_t i = 0; i < a.bad.size(); ++i) {
    const int64_t pos = a.bad[i];
    DLSTORE_EXPECT(pos >= static_cast<int64_t>(begin_[chunk]) && pos < static_cast<int64_t>(begin_[chunk + 1]),
                   Generic, "", -1, "internal: corrupt read position " << pos << " is not in chunk " << chunk);
    bad_[pos] = Corrupt{a.bad_at[i], std::move(a.bad_what[i])};
  }
  stats_.file_bytes_read += a.bytes_read;
  stats_.cache_bytes_read += a.cache_bytes_read;
  ++stats_.chunks;
  held_[chunk] = a.held_bytes;
  holding_[chunk] = 1;
  held_bytes_ += a.held_bytes;
  stats_.peak_held_bytes = std::max(stats_.peak_held_bytes, held_bytes_);
  arrived_order_.push_back(chunk);
  // Under a reordering emission, chunks arrive faster than a shuffle buffer's stragglers leave them:
  // past the budget the oldest are let go, their remaining records copied out first.
  while (!emit_.empty() && opts_.hold_bytes > 0 && held_bytes_ > opts_.hold_bytes && arrived_order_.size() > 1)
    spill_oldest();
}

void ReadSchedule::release(size_t chunk) {
  if (!holding_[chunk]) return;  // let go already (spilled)
  holding_[chunk] = 0;
  held_bytes_ -= held_[chunk];
  auto it = std::find(arrived_order_.begin(), arrived_order_.end(), chunk);
  if (it != arrived_order_.end()) arrived_order_.erase(it);
  Step s;
  s.kind = Step::Kind::Release;
  s.chunk = chunk;
  queued_.push_back(std::move(s));
}

void ReadSchedule::spill_oldest() {
  const size_t c = arrived_order_.front();
  const size_t b = begin_[c], e = begin_[c + 1];
  auto failed = failures_.find(c);
  const size_t read_until = failed == failures_.end() ? e : failed->second.first;  // records past it were not read
  Step s;
  s.kind = Step::Kind::Spill;
  s.chunk = c;
  for (size_t pos = b; pos < read_until; ++pos) {
    if (!needed_[pos] || done_[pos] || (!bad_.empty() && bad_.count(static_cast<int64_t>(pos)))) continue;
    s.positions.push_back(static_cast<int64_t>(pos));
    spilled_.insert(static_cast<int64_t>(pos));
  }
  stats_.spilled_records += s.positions.size();
  if (!s.positions.empty()) queued_.push_back(std::move(s));
  release(c);
}

void ReadSchedule::done_with(int64_t pos) {
  done_[pos] = 1;
  if (!spilled_.empty()) spilled_.erase(pos);
  const size_t c = chunk_of(pos);
  if (--left_[c] == 0) release(c);
}

Step ReadSchedule::take_batch() {
  Step s;
  s.kind = Step::Kind::Batch;
  s.positions.swap(picked_);
  s.chunks.resize(s.positions.size());
  for (size_t i = 0; i < s.positions.size(); ++i) {
    const int64_t pos = s.positions[i];
    s.chunks[i] = !spilled_.empty() && spilled_.count(pos) ? -1 : static_cast<int64_t>(chunk_of(pos));
  }
  stats_.records += s.positions.size();
  // The chunks these records empty are let go after the batch (the Release steps come next).
  for (int64_t pos : s.positions) done_with(pos);
  return s;
}

Step ReadSchedule::next() {
  DLSTORE_EXPECT(!waiting_, Generic, "", -1, "internal: a Wait step was not answered with arrived()");
  if (!queued_.empty()) {
    Step s = std::move(queued_.front());
    queued_.pop_front();
    return s;
  }
  Step s;
  if (next_read(s)) return s;  // reads are put in flight first, up to depth
  if (!building_) {
    if (pending_error_) {
      std::exception_ptr e = pending_error_;
      pending_error_ = nullptr;
      std::rethrow_exception(e);
    }
    // The first batch may be shorter, so that a plan restarted mid-batch (a resume, a failover) keeps
    // its batches on the same boundaries as the epoch's.
    want_ = (k_ == 0 && opts_.first_batch > 0) ? std::min(opts_.first_batch, opts_.batch_size) : opts_.batch_size;
    picked_.clear();
    building_ = true;
  }
  try {
    while (picked_.size() < want_ && k_ < n_emit_) {
      const int64_t pos = emit_at(k_);
      const size_t c = chunk_of(pos);
      if (c >= next_arrive_) {  // its chunk has not arrived: wait for the next one that does
        DLSTORE_EXPECT(!inflight_.empty(), Generic, "", -1, "internal: chunk " << c << " was never read");
        waiting_ = true;
        s.kind = Step::Kind::Wait;
        s.chunk = inflight_.front();
        return s;
      }
      if (!failures_.empty()) {  // a file of this chunk failed: its records from there on are missing
        auto failed = failures_.find(c);
        if (failed != failures_.end() && static_cast<size_t>(pos) >= failed->second.first &&
            (spilled_.empty() || spilled_.find(pos) == spilled_.end()))
          std::rethrow_exception(failed->second.second);
      }
      auto bad = bad_.empty() ? bad_.end() : bad_.find(pos);
      if (bad != bad_.end()) {
        const std::string& path = plan_->paths[plan_->file[pos]];
        const int64_t at = static_cast<int64_t>(bad->second.offset);
        if (opts_.on_error == OnError::Raise) {
          // The good records before it go out first; the error comes with the next call.
          std::exception_ptr e = std::make_exception_ptr(
              located_error(ErrorKind::Corrupt, path, at, bad->second.what));
          ++k_;
          done_with(pos);
          bad_.erase(bad);
          if (picked_.empty()) std::rethrow_exception(e);
          pending_error_ = e;
          break;
        }
        if (skipped_frames_.emplace(plan_->file[pos], plan_->offset[pos]).second) {
          ++stats_.skipped;
          if (corruptions_.size() < RecordScanner::kMaxReports)
            corruptions_.push_back({plan_->file[pos], at, bad->second.what});
        }
        bad_.erase(bad);
        ++k_;
        done_with(pos);
        continue;
      }
      picked_.push_back(pos);
      ++k_;
    }
  } catch (const Error&) {
    // A read failed (or a corrupt record raised): the records before it go out first, and the error
    // comes with the next call; a caller that restarts the plan (on a replica) starts right after them.
    if (picked_.empty()) {
      building_ = false;
      throw;
    }
    pending_error_ = std::current_exception();
  }
  building_ = false;
  if (picked_.empty()) return Step{};  // End
  return take_batch();
}

}  // namespace dlstore
