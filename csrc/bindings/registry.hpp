// Each area of the extension registers its own functions; module.cpp calls them in order.
#pragma once
#include <pybind11/pybind11.h>

void register_errors(pybind11::module_& m);
void register_reader(pybind11::module_& m);
void register_schedule(pybind11::module_& m);
void register_example(pybind11::module_& m);
void register_image(pybind11::module_& m);
