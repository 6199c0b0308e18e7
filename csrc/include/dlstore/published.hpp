// What a reader has done so far, as another thread reads it while the reader works: a metrics scrape
// or a training loop's stats() while the loader's thread is inside next_batch (the GIL released).
// The reading thread publishes a copy at the end of each call that reads; stats(), notes() and
// corruptions() return copies of it, so they never see a vector being grown and never wait for a
// read in flight (the lock is held only to copy).
#pragma once

#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "dlstore/record_scan.hpp"

namespace dlstore {

template <class Stats>
class Published {
 public:
  // Called by the reading thread only, at the end of each call that reads. Stats are copied whole. Notes
  // (one per file read otherwise than asked: there may be as many as files) are made and copied only when
  // `note_count` says they changed; corruptions only grow (the first kMaxReports), so only those found
  // since the last call are copied.
  template <class MakeNotes>
  void publish(const Stats& stats, size_t note_count, MakeNotes&& make_notes,
               const std::vector<CorruptionReport>& found) noexcept {
    try {
      std::vector<std::string> notes;
      const bool new_notes = note_count != published_notes_;
      if (new_notes) notes = make_notes();
      std::lock_guard<std::mutex> lock(mu_);
      stats_ = stats;
      if (new_notes) {
        notes_ = std::move(notes);
        published_notes_ = note_count;
      }
      if (found.size() > corruptions_.size())
        corruptions_.insert(corruptions_.end(), found.begin() + static_cast<std::ptrdiff_t>(corruptions_.size()),
                            found.end());
    } catch (...) {  // out of memory copying a report: the last one published stands
    }
  }
  Stats stats() const {
    std::lock_guard<std::mutex> lock(mu_);
    return stats_;
  }
  std::vector<std::string> notes() const {
    std::lock_guard<std::mutex> lock(mu_);
    return notes_;
  }
  std::vector<CorruptionReport> corruptions() const {
    std::lock_guard<std::mutex> lock(mu_);
    return corruptions_;
  }

 private:
  mutable std::mutex mu_;
  Stats stats_{};
  std::vector<std::string> notes_;
  size_t published_notes_ = 0;  // the reading thread's: the note count notes_ was made at
  std::vector<CorruptionReport> corruptions_;
};

// Publishes when the reading call returns or throws (a corrupt record under OnError::Raise is
// reported as it is raised).
template <class R>
struct PublishOnExit {
  R& reader;
  ~PublishOnExit() { reader.publish(); }
};

}  // namespace dlstore
