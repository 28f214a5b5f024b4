// 8-bit floats for FP8 matrix products (--precision fp8): OCP's E4M3 (4 exponent bits, 3 mantissa bits, max
// 448, no infinities: the top pattern is NaN) and E5M2 (5 and 2, max 57344, IEEE-style Inf and NaN), and the
// per-tensor power-of-two scale anvil quantizes a tensor with. Shared by the CPU backend (the specification)
// and the CUDA kernels, so both pick the same scale for the same amax.
#pragma once

#include <cmath>
#include <cstdint>

#include "core/dtype.h"

#if defined(__CUDACC__)
#define ANVIL_HD __host__ __device__
#else
#define ANVIL_HD
#endif

namespace anvil {

// The largest finite value of an 8-bit format (F8E4M3 or F8E5M2); both are 1.75 * 2^emax.
ANVIL_HD constexpr float fp8_max(DType t) {
    return t == DType::F8E4M3 ? 448.0f : 57344.0f;
}

// The exponent k of the scale 2^k a tensor with largest magnitude `amax` is multiplied by before rounding to
// the format: the largest k with amax * 2^k <= fp8_max (so nothing overflows and the top binade is used),
// clamped to [-126, 126]; 0 when amax is 0 or not finite (non-finite values then stay non-finite). Exact: no
// logarithm, only the exponent and mantissa of amax (amax = m 2^e, m in [0.5, 1); the max is 0.875 2^emax').
ANVIL_HD inline int fp8_scale_exp(float amax, DType t) {
    if (!(amax > 0.0f) || !(amax <= 3.4028234663852886e38f)) return 0;
    int e = 0;
    const float m = frexpf(amax, &e);
    int k = (t == DType::F8E4M3 ? 9 : 16) - e - (m > 0.875f ? 1 : 0);
    k = k < -126 ? -126 : k;
    return k > 126 ? 126 : k;
}

// x rounded to the nearest value of the format (ties to even), as the hardware converts without saturation:
// NaN stays NaN; a magnitude that rounds past the max becomes NaN (E4M3) or Inf (E5M2), as does Inf.
float fp8_round(float x, DType t);
// The format's bit pattern of fp8_round(x) and the value of a bit pattern.
uint8_t fp8_bits(float x, DType t);
float fp8_value(uint8_t bits, DType t);

// dst = fp8_round(src * 2^k) * 2^-k with k = fp8_scale_exp(max |src|): src as the FP8 product sees it.
// Returns k. NaN elements are skipped by the amax (as fmaxf skips them) and stay NaN.
int fp8_fake_quantize(float* dst, const float* src, size_t n, DType t);
// The same under a given scale (2^k, and dequant = 2^-k), a finite value whose scaled magnitude passes the
// format's max saturated to it (delayed scaling's scale may be outgrown; a scale from the operand's own amax
// never is, so this is fp8_fake_quantize's rounding there); Inf and NaN as fp8_round makes them. Returns max
// |src|, NaN skipped.
float fp8_fake_quantize_scaled(float* dst, const float* src, size_t n, DType t, float scale, float dequant);

// FP8 delayed scaling (--fp8-scaling delayed; Transformer Engine's DelayedScaling with amax_compute_algo
// "max", margin 0): an operand is scaled by fp8_scale_exp of the largest amax of its last H uses instead of
// its own, so no pass over it has to come before it is rounded; its own amax is found while it is rounded
// and joins the history for the uses after. A use is a training pass's forward of a linear layer (its input
// and weight) and that pass's backward (its output gradient). One operand's state is floats(H) f32 values:
struct Fp8History {
    static constexpr int kScale = 0;      // 2^k, the current use's scale
    static constexpr int kDequant = 64;   // 2^-k (256 bytes on, as cuBLASLt's scale pointers want them)
    static constexpr int kAmax = 128;     // the current use's amax while kPending
    static constexpr int kPending = 129;  // 1: kAmax holds an amax the ring has not taken yet
    static constexpr int kNext = 130;     // the ring's next slot, 0..H-1
    static constexpr int kFilled = 131;   // 1 once the ring holds an amax
    static constexpr int kLength = 132;   // H
    static constexpr int kRing = 192;     // H amaxes, the newest at kNext - 1
    static constexpr int kMaxLength = 1024;
    static constexpr int floats(int H) { return (kRing + H + 63) / 64 * 64; }
};
// A fresh state of history length H at st (floats(H) values): no use yet.
void fp8_history_init(float* st, int H);
// The rules of a use's beginning, shared by the CPU (fp8_history_begin) and the CUDA kernel that begins a
// use on the device, so the two cannot drift apart. Whether a use's amax has been recorded (the ring holds
// it, or will once pushed): if not, a use is scaled from its own amax.
ANVIL_HD inline bool fp8_history_recorded(const float* st) {
    return st[Fp8History::kFilled] != 0.0f || st[Fp8History::kPending] != 0.0f;
}
// The pending amax into the ring's next slot (as 0 if it is not finite: an overflowed step should not hold
// the scale down for H uses); nothing when none is pending.
ANVIL_HD inline void fp8_history_push(float* st) {
    using S = Fp8History;
    if (st[S::kPending] == 0.0f) return;
    const float a = st[S::kAmax];
    const int next = int(st[S::kNext]);
    st[S::kRing + next] = a <= 3.4028234663852886e38f ? a : 0.0f;
    st[S::kNext] = float((next + 1) % int(st[S::kLength]));
    st[S::kFilled] = 1.0f;
    st[S::kPending] = 0.0f;
}
// The use's scale from `amax` (the ring's largest, or with `own` the operand's), and with `record` its amax
// pending: `amax` where it is the operand's own, else 0 for the roundings to raise. Returns k.
ANVIL_HD inline int fp8_history_scale(float* st, float amax, DType t, bool own, bool record) {
    const int k = fp8_scale_exp(amax, t);
    st[Fp8History::kScale] = ldexpf(1.0f, k);
    st[Fp8History::kDequant] = ldexpf(1.0f, -k);
    if (record) {
        st[Fp8History::kAmax] = own ? amax : 0.0f;
        st[Fp8History::kPending] = 1.0f;
    }
    return k;
}
// Begins a use of an operand under delayed scaling (st: its state; x: the operand, n values): the amax of the
// use before, if pending, joins the ring (as 0 if it is not finite: an overflowed step should not hold the
// scale down for H uses); then 2^k and 2^-k go to kScale and kDequant, k = fp8_scale_exp of the ring's
// largest amax or, while the ring is empty, of x's own (the first use is scaled as current scaling scales
// it). With `record`, this use's amax is pending: x's own where it was found here, else 0, raised by the
// roundings (fp8_history_note). Returns k.
int fp8_history_begin(float* st, const float* x, size_t n, DType t, bool record);
// A recording use's rounding: the pending amax raised to `amax`.
void fp8_history_note(float* st, float amax);

}  // namespace anvil
