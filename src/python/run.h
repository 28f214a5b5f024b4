// The native side of anvil.train and anvil.run_command (python/anvil/__init__.py): the anvil command line run
// in the Python process.
#pragma once

#include <pybind11/pybind11.h>

namespace anvil::python {

namespace py = pybind11;

void bind_run(py::module_& m);

}  // namespace anvil::python
