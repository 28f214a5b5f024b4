// The three modes of the op table (op_cases.h): gradients on the CPU, CUDA against the CPU, timing.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <sstream>

#include "op_cases.h"
#include "../unit/harness.h"

namespace anvil::test {

Tensor Args::operator[](const std::string& name) const {
    const auto it = t.find(name);
    ANVIL_CHECK(it != t.end(), "op case: no tensor \"{}\"", name);
    return it->second;
}

namespace {

bool has_seed(const OpCase& c, const Arg& a) {
    return a.role == Role::Out && a.loss && bool(c.backward);
}

Shape shape_on(const Arg& a, const Backend& be) {
    return a.elems ? Shape{a.elems(be)} : a.shape;
}

// An owning device tensor (as the unit harness's DevTensor, any dtype).
struct Owned {
    Buffer buf;
    Tensor t;
};

std::vector<float> rounded(const std::vector<float>& v, DType dt) {
    if (dt == DType::F32) return v;
    std::vector<uint8_t> tmp(v.size() * dtype_size(dt));
    convert_from_f32(tmp.data(), dt, v.data(), v.size());
    std::vector<float> out(v.size());
    convert_to_f32(out.data(), tmp.data(), dt, v.size());
    return out;
}

void put(Backend& be, const Tensor& t, const std::vector<float>& v) {
    if (t.dtype == DType::I32) {
        std::vector<int32_t> ids(v.begin(), v.end());
        return be.upload(t, ids.data());
    }
    std::vector<uint8_t> raw(t.nbytes());
    convert_from_f32(raw.data(), t.dtype, v.data(), v.size());
    be.upload(t, raw.data());
}

std::vector<float> get(Backend& be, const Tensor& t) {
    std::vector<uint8_t> raw(t.nbytes());
    be.download(raw.data(), t);
    std::vector<float> out(size_t(t.numel()));
    if (t.dtype == DType::I32) {
        const auto* v = reinterpret_cast<const int32_t*>(raw.data());
        for (size_t i = 0; i < out.size(); i++) out[i] = float(v[i]);
        return out;
    }
    convert_to_f32(out.data(), raw.data(), t.dtype, out.size());
    return out;
}

std::vector<uint8_t> bytes_of(Backend& be, const Tensor& t) {
    std::vector<uint8_t> raw(t.nbytes());
    be.download(raw.data(), t);
    return raw;
}

// One case's tensors on a backend in dtype `dt`, filled from `host` (inputs, seeds, starting gradients);
// outputs poisoned with NaN (every byte 0xFF) when `poison`, else zero.
struct Run {
    std::vector<Owned> keep;
    Args args;
    Run(const OpCase& c, Backend& be, DType dt, const HostArgs& host, bool poison) {
        auto add = [&](const std::string& name, Shape s, DType t) {
            Owned o;
            o.buf = be.alloc(std::max<size_t>(size_t(s.numel()) * dtype_size(t), 1));
            o.t.data = o.buf.data();
            o.t.shape = s;
            o.t.dtype = t;
            o.t.device = be.device();
            keep.push_back(std::move(o));
            args.t[name] = keep.back().t;
            return keep.back().t;
        };
        for (const Arg& a : c.args) {
            const DType t = a.role == Role::Int || a.ints ? a.int_dtype : (a.f32 ? DType::F32 : dt);
            const Tensor x = add(a.name, shape_on(a, be), t);
            const bool filled = a.role == Role::In || a.role == Role::Int || a.role == Role::InOut ||
                                (a.role == Role::GradIn && a.accumulates);
            if (filled)
                put(be, x, host.at(a.name));
            else if (poison)
                be.upload(x, std::vector<uint8_t>(x.nbytes(), 0xFF).data());
            if (has_seed(c, a)) put(be, add("d" + a.name, a.shape, t), host.at("d" + a.name));
        }
    }
};

// sum(out * seed) over the outputs in the objective.
double objective(const OpCase& c, Backend& be, const Run& r, const HostArgs& host) {
    double s = 0.0;
    for (const Arg& a : c.args) {
        if (!has_seed(c, a)) continue;
        const std::vector<float> out = get(be, r.args[a.name]), &seed = host.at("d" + a.name);
        for (size_t i = 0; i < out.size(); i++) s += double(out[i]) * double(seed[i]);
    }
    return s;
}

std::string failure(const ::testing::AssertionResult& r) {
    return r ? std::string() : std::string(r.message()) + "\n";
}

}  // namespace

HostArgs draw_inputs(const OpCase& c, uint64_t seed) {
    std::mt19937_64 g(seed);
    HostArgs h;
    auto normal = [&](const Arg& a, size_t n) {
        std::normal_distribution<float> d(a.offset, a.scale);
        std::vector<float> v(n);
        for (auto& x : v) x = a.positive ? std::abs(d(g)) : d(g);
        return v;
    };
    for (const Arg& a : c.args) {
        const size_t n = size_t(a.shape.numel());
        if (a.role == Role::In || a.role == Role::InOut || (a.role == Role::GradIn && a.accumulates))
            h[a.name] = normal(a, n);
        if (a.role == Role::Int) {
            std::uniform_int_distribution<int> d(a.int_min, a.int_max - 1);
            auto& v = h[a.name];
            for (size_t i = 0; i < n; i++)
                v.push_back(float(a.fixed_ints.empty() ? d(g) : a.fixed_ints[i % a.fixed_ints.size()]));
        }
        if (has_seed(c, a)) {
            Arg unit = a;
            unit.scale = 1.0f, unit.offset = 0.0f, unit.positive = false;
            h["d" + a.name] = a.seed_const != 0.0f ? std::vector<float>(n, a.seed_const) : normal(unit, n);
        }
    }
    return h;
}

std::string check_gradients(const OpCase& c, Backend& cpu, uint64_t seed) {
    HostArgs host = draw_inputs(c, seed);
    std::string err;
    Run run(c, cpu, DType::F32, host, false);
    c.forward(cpu, run.args);
    HostArgs want;
    if (c.reference) c.reference(host, want);
    // the forward's outputs now, the backward's (GradIn) once it has run
    auto check_reference = [&](bool backward) {
        for (const auto& [name, v] : want) {
            const auto a = std::find_if(c.args.begin(), c.args.end(), [&](const Arg& x) { return x.name == name; });
            if ((a != c.args.end() && a->role == Role::GradIn) != backward) continue;
            err += failure(all_close(get(cpu, run.args[name]), v, c.reference_rtol, c.reference_atol,
                                     c.name + ": " + name + " against the host reference"));
        }
    };
    check_reference(false);
    if (!c.backward) return err;
    c.backward(cpu, run.args);
    check_reference(true);
    std::mt19937_64 g(seed ^ 0x5bd1e995);
    for (const Arg& a : c.args) {
        if (!a.diff) continue;
        std::vector<float> grad = get(cpu, run.args["d" + a.name]);
        for (const Arg& d : c.args)  // an accumulated gradient started from its drawn values
            if (d.name == "d" + a.name && d.accumulates)
                for (size_t i = 0; i < grad.size(); i++) grad[i] -= host.at(d.name)[i];
        std::vector<float>& x = host.at(a.name);
        std::vector<size_t> idx;  // a sample of coordinates keeps the test fast
        for (size_t k = 0; k < std::min<size_t>(16, x.size()); k++) idx.push_back(size_t(g() % x.size()));
        Run probe(c, cpu, DType::F32, host, false);
        auto loss = [&] {
            put(cpu, probe.args[a.name], x);
            c.forward(cpu, probe.args);
            return objective(c, cpu, probe, host);
        };
        err += failure(check_grad(x, grad, loss, c.name + ": " + a.name, c.fd_eps, c.fd_rtol, c.fd_atol, idx));
    }
    return err;
}

std::string compare_backends(const OpCase& c, Backend& cpu, Backend& gpu, DType dt, uint64_t seed) {
    HostArgs host = draw_inputs(c, seed);
    for (const Arg& a : c.args)  // both sides see exactly the values the GPU holds
        if (a.role != Role::Int && !a.f32) {
            if (host.count(a.name)) host[a.name] = rounded(host[a.name], dt);
            if (host.count("d" + a.name)) host["d" + a.name] = rounded(host["d" + a.name], dt);
        }
    Run ref(c, cpu, DType::F32, host, false);
    c.forward(cpu, ref.args);
    if (c.backward) c.backward(cpu, ref.args);
    std::vector<std::vector<uint8_t>> first;
    std::string err;
    const std::string where = c.name + " " + std::string(dtype_name(dt)) + ": ";
    for (int pass = 0; pass < 2; pass++) {  // twice: every kernel must repeat bit for bit
        Run got(c, gpu, dt, host, true);
        c.forward(gpu, got.args);
        if (c.backward) c.backward(gpu, got.args);
        size_t k = 0;
        for (const Arg& a : c.args) {
            if (a.role == Role::In || a.role == Role::Int || !a.compare) continue;
            const Tensor t = got.args[a.name];
            if (pass == 0) {
                Tol tol = a.ints ? Tol{0.0, 0.0} : tol_for(a.f32 && !a.of_rounded ? DType::F32 : dt);
                if (!a.f32 && dt != DType::F32)
                    tol.rtol *= c.low_precision_tol, tol.atol_frac *= c.low_precision_tol;
                err += failure(close(get(gpu, t), get(cpu, ref.args[a.name]), tol, where + a.name));
                first.push_back(bytes_of(gpu, t));
            } else if (first[k] != bytes_of(gpu, t)) {
                err += where + a.name + " differs between two identical runs\n";
            }
            k++;
        }
    }
    return err;
}

OpTiming time_case(const OpCase& c, Backend& be, DType dt, int reps) {
    const HostArgs host = draw_inputs(c, 1);
    Run run(c, be, dt, host, false);
    auto timed = [&](const std::function<void(Backend&, const Args&)>& f) {
        if (!f) return 0.0;
        f(be, run.args);  // warm caches and library plans
        be.synchronize();
        const auto t0 = std::chrono::steady_clock::now();
        for (int i = 0; i < reps; i++) f(be, run.args);
        be.synchronize();
        return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / reps;
    };
    OpTiming t;
    const double fwd = timed(c.forward), bwd = timed(c.backward);
    t.fwd_ms = fwd * 1e3;
    t.bwd_ms = bwd * 1e3;
    // the least the op must move: each input read once, each output written once (accumulated: twice)
    double bytes = 0, fwd_bytes = 0;
    for (const auto& [name, x] : run.args.t) {
        double b = double(x.nbytes());
        for (const Arg& a : c.args) {
            if (a.name != name) continue;
            if (a.role == Role::InOut || (a.role == Role::GradIn && a.accumulates)) b *= 2;
            if (a.role != Role::GradIn) fwd_bytes += double(x.nbytes());
        }
        bytes += b;
    }
    if (c.flops > 0) t.gflops = c.flops / (fwd + bwd) / 1e9;
    t.gbps = bytes / (fwd + bwd) / 1e9;
    if (fwd > 0) t.fwd_gbps = fwd_bytes / fwd / 1e9;
    return t;
}

}  // namespace anvil::test
