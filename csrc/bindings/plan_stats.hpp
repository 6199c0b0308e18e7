// The counters of a read plan's pass as a Python dict: one shape for the host reader and the schedule
// the GPU reader runs, so that every engine reports the same keys.
#pragma once
#include <pybind11/pybind11.h>

#include "dlstore/read_schedule.hpp"

pybind11::dict plan_stats_dict(const dlstore::PlanStats& s);
