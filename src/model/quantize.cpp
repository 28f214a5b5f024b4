#include "model/quantize.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace anvil {

void quantize_int8(const float* w, int64_t rows, int64_t cols, int out_dim, int8_t* q, float* scale) {
    const int64_t channels = out_dim == 0 ? rows : cols;
    std::vector<float> amax(size_t(channels), 0.0f);
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++) {
            float& m = amax[size_t(out_dim == 0 ? r : c)];
            m = std::max(m, std::abs(w[r * cols + c]));
        }
    for (int64_t o = 0; o < channels; o++) scale[o] = amax[size_t(o)] / 127.0f;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++) {
            const float s = scale[out_dim == 0 ? r : c];
            const float v = s > 0.0f ? std::nearbyint(w[r * cols + c] / s) : 0.0f;
            q[r * cols + c] = int8_t(std::clamp(v, -127.0f, 127.0f));
        }
}

QuantizeReport quantize_model(const Model& src, Model& dst) {
    ANVIL_CHECK(!src.config().int8_weights,
                "the model's weights are int8 already; quantize the float checkpoint");
    ANVIL_CHECK(dst.config().int8_weights, "quantize_model: the destination model is not an int8 one");
    const ParamStore& from = src.params();
    ParamStore& to = dst.params();
    QuantizeReport r;
    for (size_t i = 0; i < to.size(); i++) {
        const ParamSpec& s = to.spec(i);
        if (s.keep_dtype && s.dtype == DType::F32) continue;  // a scale, written with its weight
        const size_t j = from.find(s.name);
        ANVIL_CHECK(j != ParamStore::npos, "quantize: the source model has no \"{}\"", s.name);
        const std::vector<float> w = from.read_f32(j);
        r.bytes_before += w.size() * sizeof(float);
        if (s.dtype != DType::I8) {
            to.write_f32(i, w.data());
            r.bytes_after += to.param(i).nbytes();
            continue;
        }
        const size_t k = to.find(s.name + "_scale");
        ANVIL_ASSERT(k != ParamStore::npos && s.shape.ndim == 2);
        std::vector<int8_t> q(w.size());
        std::vector<float> scale(size_t(to.spec(k).shape.numel()));
        quantize_int8(w.data(), s.shape[0], s.shape[1], s.scale_dim, q.data(), scale.data());
        to.backend().upload(to.param(i), q.data());
        to.write_f32(k, scale.data());
        double err = 0.0, ref = 0.0;  // how far q * scale is from w
        for (int64_t a = 0; a < s.shape[0]; a++)
            for (int64_t b = 0; b < s.shape[1]; b++) {
                const size_t e = size_t(a * s.shape[1] + b);
                const double d = double(q[e]) * scale[size_t(s.scale_dim == 0 ? a : b)] - w[e];
                err += d * d;
                ref += double(w[e]) * w[e];
            }
        r.max_rel_error = std::max(r.max_rel_error, ref > 0 ? std::sqrt(err / ref) : 0.0);
        r.tensors++;
        r.weights += int64_t(w.size());
        r.bytes_after += q.size() + scale.size() * sizeof(float);
    }
    return r;
}

}  // namespace anvil
