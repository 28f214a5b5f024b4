// The native anvil.Tokenizer and anvil.Model (model.h).
#include "python/model.h"

#include <pybind11/stl.h>

#include <algorithm>
#include <cstring>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.h"
#include "data/chat.h"
#include "data/records.h"
#include "data/tokenizer.h"
#include "io/fs.h"
#include "io/json_text.h"
#include "model/generate.h"
#include "model/model_io.h"
#include "python/tensor.h"
#include "runtime/complete.h"
#include "runtime/evaluate.h"
#include "runtime/gguf_model.h"
#include "runtime/inference.h"
#include "runtime/run_dir.h"

namespace anvil::python {

namespace {

// Arrays cross as bytes of native int32 or f32 (the package makes numpy arrays of them with np.frombuffer),
// so the module depends on no numpy C API and runs with numpy 1 and 2 alike.
template <typename T>
py::bytes raw(const std::vector<T>& v) {
    return py::bytes(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
}
std::vector<int32_t> ids_of(const py::bytes& b) {
    const std::string_view v = b;
    ANVIL_CHECK(v.size() % sizeof(int32_t) == 0, "token ids: {} bytes is not a whole number of int32s",
                v.size());
    std::vector<int32_t> ids(v.size() / sizeof(int32_t));
    std::memcpy(ids.data(), v.data(), v.size());
    return ids;
}
void check_ids(const std::vector<int32_t>& ids, int vocab, const char* what) {
    for (int32_t id : ids)
        ANVIL_CHECK(id >= 0 && id < vocab, "{}: id {} is outside the vocabulary (0..{})", what, id,
                    vocab - 1);
}

struct PyTokenizer {
    std::shared_ptr<Tokenizer> tok;
};

// A model loaded for inference. Members are destroyed in reverse: the generator and the model before the
// backend they run on. Calls from Python threads take turns (mu); each releases the GIL while it runs.
struct ModelState {
    std::shared_ptr<Backend> be;
    std::shared_ptr<Tokenizer> tok;
    std::unique_ptr<Model> model;
    std::unique_ptr<Generator> gen;
    PromptTemplate prompt = PromptTemplate::Alpaca;
    std::string base_dir, adapter_dir;
    std::mutex mu;
};
using StatePtr = std::shared_ptr<ModelState>;

std::shared_ptr<Tokenizer> load_tokenizer(const std::string& spec) {
    if (spec != "byte" && (is_gguf_file(spec) || (dir_exists(spec) && tokenizer_files_in(spec).empty()))) {
        // a model or run directory, or a GGUF file: the tokenizer it was trained with
        const std::string dir = resolve_model_dir(spec, "Tokenizer.load");
        const nlohmann::json raw = read_json_file(dir + "/config.json");
        return tokenizer_for_checkpoint(dir, raw);
    }
    return make_tokenizer(spec);
}

// A record given as JSON text (the Python layer dumps a dict): an instruction record or a chat.
Example example_from_json(const std::string& json, const char* what) {
    RawRecord r = parse_jsonl_line(json, what, 1, "text");
    ANVIL_CHECK(r.reject.empty(), "{}: {}", what, r.reject);
    ANVIL_CHECK(r.example,
                "{}: give an instruction record {{\"instruction\", \"input\", \"output\"}} or a chat "
                "{{\"messages\": [...]}}",
                what);
    return std::move(r.ex);
}

void bind_tokenizer_class(py::module_& m) {
    py::class_<PyTokenizer>(m, "Tokenizer")
        .def_static("load", [](const std::string& spec) { return PyTokenizer{load_tokenizer(spec)}; })
        .def("encode",
             [](const PyTokenizer& t, const std::string& text, bool specials) {
                 return raw(specials ? t.tok->encode_with_specials(text) : t.tok->encode(text));
             })
        .def("decode",
             [](const PyTokenizer& t, const py::bytes& b) {
                 const std::vector<int32_t> ids = ids_of(b);
                 check_ids(ids, t.tok->vocab_size(), "decode");
                 return py::bytes(t.tok->decode(ids));
             })
        .def("render",
             [](const PyTokenizer& t, const std::string& record, const std::string& tmpl, bool prompt_only) {
                 const Example e = example_from_json(record, "render");
                 const PromptTemplate pt = choose_template(tmpl, *t.tok);
                 return py::make_tuple(render_text(e, pt, *t.tok, prompt_only), template_name(pt));
             })
        .def_property_readonly("eos_id", [](const PyTokenizer& t) { return t.tok->eot_id(); })
        .def_property_readonly("bos_id", [](const PyTokenizer& t) { return t.tok->bos_id(); })
        .def_property_readonly("vocab_size", [](const PyTokenizer& t) { return t.tok->vocab_size(); })
        .def_property_readonly("kind", [](const PyTokenizer& t) { return t.tok->kind(); });
}

StatePtr load_model(const std::string& path, const std::string& adapter, const std::string& device,
                    const std::string& precision, int threads, const std::string& tokenizer,
                    const std::string& tmpl) {
    const InferenceOptions o{.model_dir = path,
                             .adapter = adapter,
                             .tokenizer = tokenizer,
                             .prompt_template = tmpl,
                             .device = device,
                             .threads = threads,
                             .precision = precision};
    InferenceSetup l;
    {
        py::gil_scoped_release nogil;
        l = setup_inference(o);
    }
    auto s = std::make_shared<ModelState>();
    s->be = std::shared_ptr<Backend>(std::move(l.backend));
    s->tok = std::shared_ptr<Tokenizer>(std::move(l.tok));
    s->model = std::move(l.model);
    s->gen = std::make_unique<Generator>(*s->model);
    s->prompt = l.prompt;
    s->base_dir = l.base_dir;
    s->adapter_dir = l.adapter_dir;
    return s;
}

// The model's own activations hold at least (B, T), for evaluation.
void reserve_for(Model& model, int B, int T) {
    ANVIL_CHECK(T >= 1 && T <= model.config().n_ctx, "{} positions: the model's context is {}", T,
                model.config().n_ctx);
    if (model.max_B() >= B && model.max_T() >= T) return;
    const int nb = std::max(B, model.max_B()), nt = std::max(T, model.max_T());
    model.release();
    model.reserve(nb, nt, false);
}

// forward(ids (B, T)) -> logits (B, T, V) f32 in a tensor of their own, made a chunk of rows at a time (as
// many as the model keeps logits for at once).
PyTensor forward(ModelState& s, const py::bytes& b, int B, int T) {
    const std::vector<int32_t> ids = ids_of(b);
    ANVIL_CHECK(B >= 1 && T >= 1 && ids.size() == size_t(B) * size_t(T), "forward: {} ids are not ({}, {})",
                ids.size(), B, T);
    Model& model = *s.model;
    const int V = model.config().vocab_size;
    check_ids(ids, V, "forward");
    PyTensor out = new_tensor(s.be, Shape{B, T, V}, 0);
    const int32_t* host = ids.data();
    py::gil_scoped_release nogil;
    std::lock_guard lock(s.mu);
    reserve_for(model, B, T);
    const int chunk = std::max(1, std::min(B, model.activations().capacity(act::logits)));
    for (int b0 = 0; b0 < B; b0 += chunk) {
        const int n = std::min(chunk, B - b0);
        ForwardPass f;
        f.tokens = model.tokens(n, T);
        s.be->upload(f.tokens, host + size_t(b0) * size_t(T));
        model.forward(f);
        const Tensor dst = out.t.range(size_t(b0) * size_t(T) * size_t(V), size_t(n) * size_t(T) * size_t(V));
        s.be->convert(dst, model.logits(n, T).view(Shape{int64_t(n) * T * V}));
    }
    s.be->synchronize();
    return out;
}

// score(text): each token's log-probability after the end-of-text token that opens it (the last n_ctx of
// them when longer), as training scores targets.
py::tuple score_one(ModelState& s, const std::string& text) {
    const std::vector<int32_t> ids = text_row(*s.tok, text);
    const int T = std::min(int(ids.size()) - 1, s.model->config().n_ctx);
    std::vector<float> lp;
    if (T > 0) {
        py::gil_scoped_release nogil;
        std::lock_guard lock(s.mu);
        reserve_for(*s.model, 1, T);
        lp = token_logprobs(*s.model, std::vector<int32_t>(ids.end() - T - 1, ids.end()));
    }
    return py::make_tuple(raw(std::vector<int32_t>(ids.end() - T, ids.end())), raw(lp));
}

// Ctrl-C between tokens: Python's signal handlers run (on the main thread); one that raises (SIGINT's
// KeyboardInterrupt) ends the generation and is raised when the call returns. True: go on.
bool signals_ok(std::exception_ptr& err) {
    if (err) return false;
    py::gil_scoped_acquire gil;
    if (PyErr_CheckSignals() == 0) return true;
    err = std::make_exception_ptr(py::error_already_set());
    return false;
}

struct SampleArgs {
    SampleOptions s;
    std::vector<std::string> stop;
    bool ignore_eos = false, logprobs = false;
};

// One completion of `prompt`; on_text (or None) sees each piece of text as it becomes showable and may end
// the generation by returning False. Returns (text, tokens, finish_reason, logprobs or None).
py::tuple generate(ModelState& s, const std::vector<int32_t>& prompt, SampleArgs a,
                   const py::object& on_text) {
    const Tokenizer& tok = *s.tok;
    if (!a.ignore_eos) a.s.stop_tokens = stop_tokens(s.prompt, tok);
    a.s.vocab_real = tok.vocab_size();
    std::exception_ptr err;
    const auto on_piece = [&](const std::string& piece) {
        if (!signals_ok(err)) return false;
        if (on_text.is_none() || piece.empty()) return true;
        py::gil_scoped_acquire gil;
        try {
            return py::bool_(on_text(py::bytes(piece))).cast<bool>();
        } catch (...) {
            err = std::current_exception();
            return false;
        }
    };
    TextCompletion c;
    {
        py::gil_scoped_release nogil;
        std::lock_guard lock(s.mu);
        c = complete_text(*s.gen, tok, a.s, prompt, a.stop, on_piece, a.logprobs);
    }
    if (err) std::rethrow_exception(err);
    py::object lp = py::none();
    if (a.logprobs) lp = py::cast(c.logprobs);
    return py::make_tuple(py::bytes(c.text), raw(c.tokens), c.finish_reason, lp);
}

std::vector<int32_t> chat_prompt(const ModelState& s,
                                 const std::vector<std::pair<std::string, std::string>>& msgs) {
    Example e;
    for (const auto& [role, content] : msgs) {
        Role r;
        ANVIL_CHECK(parse_role(role, &r), "chat: role \"{}\" is not system, user or assistant", role);
        e.messages.push_back({r, content});
    }
    ANVIL_CHECK(!e.messages.empty() && e.messages.back().role == Role::User,
                "chat: the conversation must end with a user message");
    return prompt_tokens(e, s.prompt, *s.tok);
}

// Copies `src` into parameter `name` (its shape, any float dtype; same device, or from the CPU).
void load_param(ModelState& s, const std::string& name, const PyTensor& src) {
    ParamStore& store = s.model->params();
    const size_t i = store.find(name);
    ANVIL_CHECK(i != ParamStore::npos, "load_state_dict: \"{}\" is not a parameter of this model", name);
    const Tensor dst = store.param(i);
    ANVIL_CHECK(src.t.shape == dst.shape, "load_state_dict: \"{}\" is {} here, {} given", name,
                dst.shape.str(), src.t.shape.str());
    const auto is_float = [](DType d) { return d == DType::F32 || d == DType::BF16 || d == DType::F16; };
    ANVIL_CHECK(is_float(src.t.dtype) && is_float(dst.dtype),
                "load_state_dict: \"{}\": {} into {}: give float "
                "tensors for float parameters",
                name, dtype_name(src.t.dtype), dtype_name(dst.dtype));
    py::gil_scoped_release nogil;
    std::lock_guard lock(s.mu);
    const bool direct = src.t.dtype == dst.dtype || src.t.dtype == DType::F32 || dst.dtype == DType::F32;
    if (src.t.data == dst.data) {
        // its own state_dict's tensor: nothing to copy
    } else if (src.t.device == dst.device && direct) {
        s.be->convert(dst, src.t);
    } else {
        ANVIL_CHECK(src.t.device == Device::CPU,
                    "load_state_dict: \"{}\": a {} CUDA tensor into a {} parameter on the {}: give a float32 "
                    "tensor or "
                    "one of the parameter's dtype on its device, or a CPU tensor",
                    name, dtype_name(src.t.dtype), dtype_name(dst.dtype), device_name(dst.device));
        std::vector<float> f32(size_t(src.t.numel()));
        convert_to_f32(f32.data(), src.t.data, src.t.dtype, f32.size());
        store.write_f32(i, f32.data());
    }
    s.be->synchronize();
}

void bind_model_methods(py::class_<ModelState, StatePtr>& c) {
    c.def("forward", &forward)
        .def("score", &score_one)
        .def("generate",
             [](ModelState& s, const std::vector<int32_t>& prompt, const py::dict& k,
                const py::object& on_text) {
                 SampleArgs a;
                 a.s.max_new_tokens = k["max_new_tokens"].cast<int>();
                 a.s.temperature = k["temperature"].cast<float>();
                 a.s.top_k = k["top_k"].cast<int>();
                 a.s.top_p = k["top_p"].cast<float>();
                 a.s.min_p = k["min_p"].cast<float>();
                 a.s.presence_penalty = k["presence_penalty"].cast<float>();
                 a.s.frequency_penalty = k["frequency_penalty"].cast<float>();
                 a.s.repetition_penalty = k["repetition_penalty"].cast<float>();
                 a.s.seed = k["seed"].cast<uint64_t>();
                 a.stop = k["stop"].cast<std::vector<std::string>>();
                 a.ignore_eos = k["ignore_eos"].cast<bool>();
                 a.logprobs = k["logprobs"].cast<bool>();
                 return generate(s, prompt, std::move(a), on_text);
             })
        .def("prompt_ids",
             [](const ModelState& s, const std::string& text) { return s.tok->encode_prompt(text); })
        .def("instruction_ids",
             [](const ModelState& s, const std::string& instruction, const std::string& input) {
                 return prompt_tokens(Example{instruction, input, "", {}}, s.prompt, *s.tok);
             })
        .def("chat_ids", &chat_prompt)
        .def("state_dict",
             [](const StatePtr& s) {
                 std::vector<std::pair<std::string, PyTensor>> out;
                 const ParamStore& store = s->model->params();
                 for (size_t i = 0; i < store.size(); i++)
                     out.emplace_back(store.spec(i).name, PyTensor{store.param(i), s, s->be, 0});
                 return out;
             })
        .def("load_param", &load_param);
}

}  // namespace

void bind_tokenizer(py::module_& m) {
    bind_tokenizer_class(m);
}

void bind_model(py::module_& m) {
    py::class_<ModelState, StatePtr> c(m, "Model");
    c.def_static("load", &load_model, py::arg("path"), py::arg("adapter"), py::arg("device"),
                 py::arg("precision"), py::arg("threads"), py::arg("tokenizer"), py::arg("template"))
        .def_property_readonly(
            "config_json",
            [](const ModelState& s) { return json_text(read_json_file(s.base_dir + "/config.json")); })
        .def_property_readonly("tokenizer", [](const ModelState& s) { return PyTokenizer{s.tok}; })
        .def_property_readonly("template",
                               [](const ModelState& s) { return std::string(template_name(s.prompt)); })
        .def_property_readonly("device",
                               [](const ModelState& s) { return std::string(device_name(s.be->device())); })
        .def_property_readonly("n_ctx", [](const ModelState& s) { return s.model->config().n_ctx; })
        .def_property_readonly("base_dir", [](const ModelState& s) { return s.base_dir; })
        .def_property_readonly("adapter_dir", [](const ModelState& s) { return s.adapter_dir; });
    bind_model_methods(c);
}

}  // namespace anvil::python
