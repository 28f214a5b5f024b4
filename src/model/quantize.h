// Weight-only int8 quantization (anvil quantize). Symmetric and per output channel: channel o of a weight
// gets scale[o] = max |W[o, :]| / 127 and q = round(W / scale[o]) in [-127, 127], so W ~ q * scale[o]. Every
// linear layer's weight and the token embedding (whose rows are the tied head's output channels) are
// quantized; norms, biases and learned positions stay float. An int8 model is a frozen base: it generates,
// evaluates, serves and takes LoRA adapters (QLoRA-style), and is never trained itself.
#pragma once

#include <cstdint>

#include "model/model.h"

namespace anvil {

// w holds `rows` x `cols` floats; the output channels run along dimension out_dim (0: rows, 1: columns).
// Fills q (same layout) and scale (one per channel). An all-zero channel gets scale 0 and q 0.
void quantize_int8(const float* w, int64_t rows, int64_t cols, int out_dim, int8_t* q, float* scale);

struct QuantizeReport {
    int tensors = 0;           // quantized weights
    int64_t weights = 0;       // their elements
    double max_rel_error = 0;  // the largest per-tensor RMS error relative to the tensor's RMS
    size_t bytes_before = 0, bytes_after = 0;  // the parameters' bytes, float then int8
};

// `dst`, a model of src's config with int8_weights set, takes src's weights: each int8 entry quantized from
// the float entry of the same name, every other entry copied.
QuantizeReport quantize_model(const Model& src, Model& dst);

}  // namespace anvil
