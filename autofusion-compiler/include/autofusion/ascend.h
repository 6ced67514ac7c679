/* autofusion Ascend C helpers: what every generated Ascend C file includes after its AfTiling
 * struct (tiling load, scalar GM access, chunked row copies). Part of autofusion-compiler;
 * written next to the generated files by each build. */
#ifndef AUTOFUSION_ASCEND_H
#define AUTOFUSION_ASCEND_H

/* Non-finite constants from compiler builtins: kernels include no libc header, so INFINITY
 * and NAN are not there (the devkit's SIMT constants are builtins too: ASCRT_INF_F). */
#define AF_INF (__builtin_inff())
#define AF_NEG_INF (-__builtin_inff())
#define AF_NAN (__builtin_nanf(""))

/* Read kernel `k`'s tiling from GM once (scalar reads go through the data cache, as
 * CATLASS's dynamic matmul kernels copy theirs once). */
__aicore__ inline void af_load_tiling(GM_ADDR tilings, int64_t k, AfTiling &t) {
    AscendC::GlobalTensor<int64_t> w;
    w.SetGlobalBuffer((__gm__ int64_t *)(tilings + k * sizeof(AfTiling)), sizeof(AfTiling) / 8);
    int64_t *dst = reinterpret_cast<int64_t *>(&t);
    for (uint32_t i = 0; i < sizeof(AfTiling) / 8; ++i) dst[i] = w.GetValue(i);
}
__aicore__ inline void af_load_dims(GM_ADDR args, int64_t *dims) {
    AscendC::GlobalTensor<int64_t> w;
    w.SetGlobalBuffer((__gm__ int64_t *)args, AF_MAX_DIMS);
    for (int i = 0; i < AF_MAX_DIMS; ++i) dims[i] = w.GetValue(i);
}
__aicore__ inline GM_ADDR af_buf(GM_ADDR args, int64_t i) {
    AscendC::GlobalTensor<uint64_t> w;
    w.SetGlobalBuffer((__gm__ uint64_t *)args + AF_MAX_DIMS + i, 1);
    return (GM_ADDR)(uintptr_t)w.GetValue(0);
}
__aicore__ inline int64_t af_min(int64_t a, int64_t b) { return a < b ? a : b; }
__aicore__ inline int64_t af_max(int64_t a, int64_t b) { return a > b ? a : b; }
/* Scalar math on the vector unit: one value through an 8-float UB scratch (the vector unit has no scalar
 * transcendental instructions). */
__aicore__ inline float af_s_exp(AscendC::LocalTensor<float> &s, float x) { s.SetValue(0, x); AscendC::Exp(s, s, 1); return s.GetValue(0); }
__aicore__ inline float af_s_ln(AscendC::LocalTensor<float> &s, float x) { s.SetValue(0, x); AscendC::Ln(s, s, 1); return s.GetValue(0); }
__aicore__ inline float af_s_sqrt(AscendC::LocalTensor<float> &s, float x) { s.SetValue(0, x); AscendC::Sqrt(s, s, 1); return s.GetValue(0); }
__aicore__ inline float af_s_round(AscendC::LocalTensor<float> &s, AscendC::LocalTensor<half> &h, float x) {
    s.SetValue(0, x); AscendC::Cast<half, float>(h, s, AscendC::RoundMode::CAST_RINT, 1); AscendC::Cast<float, half>(s, h, AscendC::RoundMode::CAST_NONE, 1); return s.GetValue(0);
}
__aicore__ inline float af_s_round_bf(AscendC::LocalTensor<float> &s, AscendC::LocalTensor<bfloat16_t> &h, float x) {
    s.SetValue(0, x); AscendC::Cast<bfloat16_t, float>(h, s, AscendC::RoundMode::CAST_RINT, 1); AscendC::Cast<float, bfloat16_t>(s, h, AscendC::RoundMode::CAST_NONE, 1); return s.GetValue(0);
}
__aicore__ inline float af_s_tanh(AscendC::LocalTensor<float> &s, float x) { return 2.0f / (1.0f + af_s_exp(s, -2.0f * x)) - 1.0f; }
__aicore__ inline float af_s_sigmoid(AscendC::LocalTensor<float> &s, float x) { return 1.0f / (1.0f + af_s_exp(s, -x)); }
/* sin and cos as the host's af_sinf / af_cosf: x reduced by 2 pi (the 1.5 * 2^23 rounding
 * trick, 2 pi in two parts), then the Taylor series to r^15 / r^16 on [-pi, pi]. */
__aicore__ inline float af_s_reduce_2pi(float x) {
    const float k = (x * 0.15915494309189535f + 12582912.0f) - 12582912.0f;
    return (x - k * 6.28125f) - k * 1.9353071795864769e-3f;
}
__aicore__ inline float af_s_sin(float x) {
    const float r = af_s_reduce_2pi(x), r2 = r * r;
    const float p = ((((((-7.6471637318198164e-13f * r2 + 1.6059043836821613e-10f) * r2 - 2.5052108385441720e-8f) * r2 + 2.7557319223985893e-6f) * r2 - 1.9841269841269841e-4f) * r2 + 8.3333333333333332e-3f) * r2 - 1.6666666666666666e-1f) * r2 + 1.0f;
    return p * r;
}
__aicore__ inline float af_s_cos(float x) {
    const float r = af_s_reduce_2pi(x), r2 = r * r;
    return (((((((4.7794773323873853e-14f * r2 - 1.1470745597729725e-11f) * r2 + 2.0876756987868099e-9f) * r2 - 2.7557319223985888e-7f) * r2 + 2.4801587301587302e-5f) * r2 - 1.3888888888888889e-3f) * r2 + 4.1666666666666664e-2f) * r2 - 0.5f) * r2 + 1.0f;
}
/* erf by Abramowitz-Stegun 7.1.26 (|error| <= 1.5e-7). */
__aicore__ inline float af_s_erf(AscendC::LocalTensor<float> &s, float x) {
    const float a = x < 0.0f ? -x : x, t = 1.0f / (1.0f + 0.3275911f * a);
    const float p = ((((1.061405429f * t - 1.453152027f) * t + 1.421413741f) * t - 0.284496736f) * t + 0.254829592f) * t;
    const float e = 1.0f - p * af_s_exp(s, -a * a);
    return x < 0.0f ? -e : e;
}

#endif /* AUTOFUSION_ASCEND_H */
