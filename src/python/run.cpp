// anvil.train and anvil.run_command: the command line run in the Python process (cli/app.cpp's run_anvil),
// errors raised as exceptions, a training run's steps handed to a Python callback.
#include "python/run.h"

#include <pybind11/stl.h>

#include <exception>
#include <memory>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "io/json_text.h"

namespace anvil::python {

namespace {

// run_cli(args, on_step) -> {"status", "ended", "out", "model_dir", "step", "interrupted",
// "stopped_by_callback"}: on_step (or None) gets each training step's metrics record as a dict; returning
// False stops the run after that step (it checkpoints, as on SIGINT); an exception in it stops the run the
// same way and is raised once the checkpoint is written.
py::dict run_cli(const std::vector<std::string>& args, const py::object& on_step) {
    auto hooks = std::make_shared<TrainHooks>();
    std::exception_ptr err;
    std::string out, model_dir;
    int64_t step = 0;
    bool interrupted = false, ended = false, stopped = false;
    const py::object loads = py::module_::import("json").attr("loads");
    if (!on_step.is_none()) {
        hooks->on_step = [&](const nlohmann::json& rec) {
            if (err) return false;
            py::gil_scoped_acquire gil;
            try {
                const py::object r = on_step(loads(json_text(rec)));
                const bool go = r.is_none() || r.cast<bool>();
                stopped = stopped || !go;
                return go;
            } catch (...) {
                err = std::current_exception();
                return false;
            }
        };
    }
    hooks->on_end = [&](const TrainHooks::End& e) {
        out = e.out, model_dir = e.model_dir, step = e.step, interrupted = e.interrupted, ended = true;
    };
    int status = 0;
    {
        py::gil_scoped_release nogil;
        status = cli::run_anvil(args, cli::Embedding{true, hooks});
    }
    if (err) std::rethrow_exception(err);
    py::dict r;
    r["status"] = status;
    r["ended"] = ended;
    r["out"] = out;
    r["model_dir"] = model_dir;
    r["step"] = step;
    r["interrupted"] = interrupted;
    r["stopped_by_callback"] = stopped;
    return r;
}

}  // namespace

void bind_run(py::module_& m) {
    m.def("run_cli", &run_cli, py::arg("args"), py::arg("on_step") = py::none());
}

}  // namespace anvil::python
