// anvil._anvil: the native module under the `anvil` Python package (python/anvil/). It binds the layers as
// they are; the package gives them the classes and keyword arguments a PyTorch user expects. anvil's errors
// arrive as Python exceptions carrying the one-line message the CLI would print:
//   anvil.Error            every anvil error
//   anvil.InputError       what was given is wrong (a flag, a file, a record): the message says what to do
//   anvil.DeviceError      the device or its libraries failed
//   anvil.OutOfMemory      an allocation did not fit the device (a DeviceError)
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "core/error.h"
#include "core/version.h"
#include "io/json_text.h"
#include "monitor/doctor.h"
#include "python/model.h"
#include "python/run.h"
#include "python/tensor.h"

namespace py = pybind11;

PYBIND11_MODULE(_anvil, m) {
    m.doc() = "anvil's native layer; import anvil instead";
    // translators run newest first: the subclasses are registered after their bases
    static py::exception<anvil::Error> error(m, "Error", PyExc_RuntimeError);
    static py::exception<anvil::InputError> input(m, "InputError", error.ptr());
    static py::exception<anvil::DeviceError> device(m, "DeviceError", error.ptr());
    static py::exception<anvil::OutOfMemory> oom(m, "OutOfMemory", device.ptr());
    py::register_exception_translator([](std::exception_ptr p) {
        try {
            if (p) std::rethrow_exception(p);
        } catch (const anvil::OutOfMemory& e) {
            PyErr_SetString(oom.ptr(), e.what());
        } catch (const anvil::InputError& e) {
            PyErr_SetString(input.ptr(), e.what());
        } catch (const anvil::DeviceError& e) {
            PyErr_SetString(device.ptr(), e.what());
        } catch (const anvil::Error& e) {
            PyErr_SetString(error.ptr(), e.what());
        }
    });
    anvil::python::bind_tensor(m);
    anvil::python::bind_tokenizer(m);
    anvil::python::bind_model(m);
    anvil::python::bind_run(m);
    m.def("version", [] { return std::string(anvil::version_string()); });
    m.def(
        "doctor_json",
        [](const std::string& device) {
            anvil::DoctorReport r;
            {
                py::gil_scoped_release nogil;
                r = anvil::run_doctor(device);
            }
            return anvil::json_text(r.json);
        },
        py::arg("device") = "auto");
}
