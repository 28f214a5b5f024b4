// The native side of anvil.Tokenizer and anvil.Model (python/anvil/__init__.py wraps them in the classes a
// user reads with help()): a tokenizer, and a model loaded for inference as `anvil generate` and `anvil eval`
// load it (runtime/inference.h), with the same prompt template, stop tokens and sampling.
#pragma once

#include <pybind11/pybind11.h>

namespace anvil::python {

namespace py = pybind11;

void bind_tokenizer(py::module_& m);
void bind_model(py::module_& m);

}  // namespace anvil::python
