/*
 * ascend-sim: vector compute, count form ("first n elements", docs/ascend-c.md 2.1-2.4, 11.6;
 * invariants 11.8 items 2, 3, 6, 7, 8).
 *
 * Every operand: live, in UB of an AIV, 32-byte aligned, `count` elements within the tensor;
 * dtype legal per the A2 table of section 2.2; in place (dst == src exactly) allowed, partial
 * overlap rejected. Values are computed in double and rounded to the element type once per
 * instruction (half/bfloat16_t: round to nearest even).
 */
#ifndef ASCEND_SIM_KERNEL_OPERATOR_VEC_INTF_H
#define ASCEND_SIM_KERNEL_OPERATOR_VEC_INTF_H

#include "kernel_tensor.h"
#include <type_traits>

namespace ascend_sim {

/* dtype sets of section 2.2 */
enum : uint32_t {
    DT_F32 = 1u << 0,
    DT_F16 = 1u << 1,
    DT_BF16 = 1u << 2,
    DT_I16 = 1u << 3,
    DT_U16 = 1u << 4,
    DT_I32 = 1u << 5,
    DT_U32 = 1u << 6,
};
constexpr uint32_t DT_ARITH = DT_I16 | DT_F16 | DT_I32 | DT_F32; /* Add Sub Mul Max Min Adds Muls ... */
constexpr uint32_t DT_FLOATS = DT_F16 | DT_F32;                  /* Div Exp Ln Sqrt Reciprocal Abs ... */
constexpr uint32_t DT_RELU = DT_F16 | DT_I32 | DT_F32;
constexpr uint32_t DT_DUP = DT_I16 | DT_U16 | DT_F16 | DT_BF16 | DT_I32 | DT_U32 | DT_F32;

template <class T>
constexpr uint32_t dt_bit()
{
    if constexpr (std::is_same_v<T, float>) return DT_F32;
    else if constexpr (std::is_same_v<T, half>) return DT_F16;
    else if constexpr (std::is_same_v<T, bfloat16_t>) return DT_BF16;
    else if constexpr (std::is_same_v<T, int16_t>) return DT_I16;
    else if constexpr (std::is_same_v<T, uint16_t>) return DT_U16;
    else if constexpr (std::is_same_v<T, int32_t>) return DT_I32;
    else if constexpr (std::is_same_v<T, uint32_t>) return DT_U32;
    else return 0;
}

inline std::string dt_list(uint32_t set)
{
    static const char* const names[] = {"float", "half", "bfloat16_t", "int16_t", "uint16_t", "int32_t", "uint32_t"};
    std::string s;
    for (int i = 0; i < 7; ++i) {
        if (set & (1u << i)) s += (s.empty() ? "" : ", ") + std::string(names[i]);
    }
    return s;
}

template <class T>
void check_dtype(const char* api, uint32_t allowed)
{
    if (!(dt_bit<T>() & allowed)) {
        failf(api, " does not support ", type_name<T>(), " on A2 (allowed: ", dt_list(allowed), "; section 2.2)");
    }
}

inline uint64_t check_count(int64_t count, const char* api)
{
    if (count < 0) failf(api, ": count ", count, " < 0");
    return static_cast<uint64_t>(count);
}

/* dst[i] = f(src0[i], src1[i]) */
template <class T, class F>
void binary_op(const char* api, uint32_t dts, const AscendC::LocalTensor<T>& dst, const AscendC::LocalTensor<T>& a,
               const AscendC::LocalTensor<T>& b, int64_t count, F f)
{
    CoreCtx& c = core();
    check_dtype<T>(api, dts);
    const uint64_t n = check_count(count, api);
    if (n == 0) return; /* NOP on A2 */
    uint8_t* d = ub_operand(c, dst, n, api, "dst", true);
    const uint8_t* pa = ub_operand(c, a, n, api, "src0", false);
    const uint8_t* pb = ub_operand(c, b, n, api, "src1", false);
    check_overlap(dst, n, a, n, api, "src0");
    check_overlap(dst, n, b, n, api, "src1");
    const uint64_t seq = ++c.seq;
    touch(c, a, n * sizeof(T), P_V, false, seq, api, "src0");
    touch(c, b, n * sizeof(T), P_V, false, seq, api, "src1");
    touch(c, dst, n * sizeof(T), P_V, true, seq, api, "dst");
    for (uint64_t i = 0; i < n; ++i) {
        const double x = to_num(ld<T>(pa + i * sizeof(T))), y = to_num(ld<T>(pb + i * sizeof(T)));
        st<T>(d + i * sizeof(T), from_num<T>(f(x, y)));
    }
}

/* dst[i] = f(src[i]) */
template <class T, class F>
void unary_op(const char* api, uint32_t dts, const AscendC::LocalTensor<T>& dst, const AscendC::LocalTensor<T>& src,
              int64_t count, F f)
{
    CoreCtx& c = core();
    check_dtype<T>(api, dts);
    const uint64_t n = check_count(count, api);
    if (n == 0) return;
    uint8_t* d = ub_operand(c, dst, n, api, "dst", true);
    const uint8_t* s = ub_operand(c, src, n, api, "src", false);
    check_overlap(dst, n, src, n, api, "src");
    const uint64_t seq = ++c.seq;
    touch(c, src, n * sizeof(T), P_V, false, seq, api, "src");
    touch(c, dst, n * sizeof(T), P_V, true, seq, api, "dst");
    for (uint64_t i = 0; i < n; ++i) {
        st<T>(d + i * sizeof(T), from_num<T>(f(to_num(ld<T>(s + i * sizeof(T))))));
    }
}

/* dst[i] = f(dst[i], src0[i], src1[i]) (compound ops that also read dst) */
template <class T, class F>
void ternary_dst_op(const char* api, uint32_t dts, const AscendC::LocalTensor<T>& dst,
                    const AscendC::LocalTensor<T>& a, const AscendC::LocalTensor<T>& b, int64_t count, F f)
{
    CoreCtx& c = core();
    check_dtype<T>(api, dts);
    const uint64_t n = check_count(count, api);
    if (n == 0) return;
    uint8_t* d = ub_operand(c, dst, n, api, "dst", true);
    const uint8_t* pa = ub_operand(c, a, n, api, "src0", false);
    const uint8_t* pb = ub_operand(c, b, n, api, "src1", false);
    check_overlap(dst, n, a, n, api, "src0");
    check_overlap(dst, n, b, n, api, "src1");
    const uint64_t seq = ++c.seq;
    touch(c, dst, n * sizeof(T), P_V, false, seq, api, "dst");
    touch(c, a, n * sizeof(T), P_V, false, seq, api, "src0");
    touch(c, b, n * sizeof(T), P_V, false, seq, api, "src1");
    touch(c, dst, n * sizeof(T), P_V, true, seq, api, "dst");
    for (uint64_t i = 0; i < n; ++i) {
        const double z = to_num(ld<T>(d + i * sizeof(T)));
        const double x = to_num(ld<T>(pa + i * sizeof(T))), y = to_num(ld<T>(pb + i * sizeof(T)));
        st<T>(d + i * sizeof(T), from_num<T>(f(z, x, y)));
    }
}

inline double vmax(double a, double b) { return (a != a) ? a : (b != b) ? b : (a > b ? a : b); }
inline double vmin(double a, double b) { return (a != a) ? a : (b != b) ? b : (a < b ? a : b); }

} // namespace ascend_sim

namespace AscendC {

/* ---- Binary (section 2.2) ---- */
template <typename T>
void Add(const LocalTensor<T>& dst, const LocalTensor<T>& src0, const LocalTensor<T>& src1, const int32_t& count)
{
    ascend_sim::binary_op("Add", ascend_sim::DT_ARITH, dst, src0, src1, count, [](double a, double b) { return a + b; });
}
template <typename T>
void Sub(const LocalTensor<T>& dst, const LocalTensor<T>& src0, const LocalTensor<T>& src1, const int32_t& count)
{
    ascend_sim::binary_op("Sub", ascend_sim::DT_ARITH, dst, src0, src1, count, [](double a, double b) { return a - b; });
}
template <typename T>
void Mul(const LocalTensor<T>& dst, const LocalTensor<T>& src0, const LocalTensor<T>& src1, const int32_t& count)
{
    ascend_sim::binary_op("Mul", ascend_sim::DT_ARITH, dst, src0, src1, count, [](double a, double b) { return a * b; });
}
template <typename T>
void Div(const LocalTensor<T>& dst, const LocalTensor<T>& src0, const LocalTensor<T>& src1, const int32_t& count)
{
    ascend_sim::binary_op("Div", ascend_sim::DT_FLOATS, dst, src0, src1, count, [](double a, double b) { return a / b; });
}
template <typename T>
void Max(const LocalTensor<T>& dst, const LocalTensor<T>& src0, const LocalTensor<T>& src1, const int32_t& count)
{
    ascend_sim::binary_op("Max", ascend_sim::DT_ARITH, dst, src0, src1, count, ascend_sim::vmax);
}
template <typename T>
void Min(const LocalTensor<T>& dst, const LocalTensor<T>& src0, const LocalTensor<T>& src1, const int32_t& count)
{
    ascend_sim::binary_op("Min", ascend_sim::DT_ARITH, dst, src0, src1, count, ascend_sim::vmin);
}
template <typename T>
void AddRelu(const LocalTensor<T>& dst, const LocalTensor<T>& src0, const LocalTensor<T>& src1, const int32_t& count)
{
    ascend_sim::binary_op("AddRelu", ascend_sim::DT_I16 | ascend_sim::DT_FLOATS, dst, src0, src1, count,
                          [](double a, double b) { return ascend_sim::vmax(a + b, 0.0); });
}
/* dst = src0 * dst + src1 */
template <typename T>
void FusedMulAdd(const LocalTensor<T>& dst, const LocalTensor<T>& src0, const LocalTensor<T>& src1,
                 const int32_t& count)
{
    ascend_sim::ternary_dst_op("FusedMulAdd", ascend_sim::DT_FLOATS, dst, src0, src1, count,
                               [](double d, double a, double b) { return a * d + b; });
}
/* dst += src0 * src1 (same element type only in the sim) */
template <typename T>
void MulAddDst(const LocalTensor<T>& dst, const LocalTensor<T>& src0, const LocalTensor<T>& src1,
               const int32_t& count)
{
    ascend_sim::ternary_dst_op("MulAddDst", ascend_sim::DT_FLOATS, dst, src0, src1, count,
                               [](double d, double a, double b) { return d + a * b; });
}

/* ---- Tensor-scalar (section 2.2): the scalar has the element type. ---- */
template <typename T>
void Adds(const LocalTensor<T>& dst, const LocalTensor<T>& src, const T& scalarValue, const int32_t& count)
{
    const double s = ascend_sim::to_num(scalarValue);
    ascend_sim::unary_op("Adds", ascend_sim::DT_ARITH, dst, src, count, [s](double a) { return a + s; });
}
template <typename T>
void Muls(const LocalTensor<T>& dst, const LocalTensor<T>& src, const T& scalarValue, const int32_t& count)
{
    const double s = ascend_sim::to_num(scalarValue);
    ascend_sim::unary_op("Muls", ascend_sim::DT_ARITH, dst, src, count, [s](double a) { return a * s; });
}
template <typename T>
void Maxs(const LocalTensor<T>& dst, const LocalTensor<T>& src, const T& scalarValue, const int32_t& count)
{
    const double s = ascend_sim::to_num(scalarValue);
    ascend_sim::unary_op("Maxs", ascend_sim::DT_ARITH, dst, src, count, [s](double a) { return ascend_sim::vmax(a, s); });
}
template <typename T>
void Mins(const LocalTensor<T>& dst, const LocalTensor<T>& src, const T& scalarValue, const int32_t& count)
{
    const double s = ascend_sim::to_num(scalarValue);
    ascend_sim::unary_op("Mins", ascend_sim::DT_ARITH, dst, src, count, [s](double a) { return ascend_sim::vmin(a, s); });
}
template <typename T>
void LeakyRelu(const LocalTensor<T>& dst, const LocalTensor<T>& src, const T& alpha, const int32_t& count)
{
    const double s = ascend_sim::to_num(alpha);
    ascend_sim::unary_op("LeakyRelu", ascend_sim::DT_FLOATS, dst, src, count,
                         [s](double a) { return a > 0 ? a : a * s; });
}
/* dst += src * scalar: the official <T, U> signature (a half source into a float destination
 * exists on hardware); the sim supports one element type for both. */
template <typename T, typename U>
void Axpy(const LocalTensor<T>& dst, const LocalTensor<U>& src, const U& scalarValue, const int32_t& count)
{
    static_assert(std::is_same<T, U>::value, "ascend-sim: Axpy with a destination type other than the source's");
    const double s = ascend_sim::to_num(scalarValue);
    ascend_sim::ternary_dst_op("Axpy", ascend_sim::DT_FLOATS, dst, src, src, count,
                               [s](double d, double a, double) { return d + a * s; });
}

/* ---- Unary (section 2.2) ---- */
template <typename T>
void Exp(const LocalTensor<T>& dst, const LocalTensor<T>& src, const int32_t& count)
{
    ascend_sim::unary_op("Exp", ascend_sim::DT_FLOATS, dst, src, count, [](double a) { return std::exp(a); });
}
template <typename T>
void Ln(const LocalTensor<T>& dst, const LocalTensor<T>& src, const int32_t& count)
{
    ascend_sim::unary_op("Ln", ascend_sim::DT_FLOATS, dst, src, count, [](double a) { return std::log(a); });
}
template <typename T>
void Sqrt(const LocalTensor<T>& dst, const LocalTensor<T>& src, const int32_t& count)
{
    ascend_sim::unary_op("Sqrt", ascend_sim::DT_FLOATS, dst, src, count, [](double a) { return std::sqrt(a); });
}
template <typename T>
void Rsqrt(const LocalTensor<T>& dst, const LocalTensor<T>& src, const int32_t& count)
{
    ascend_sim::unary_op("Rsqrt", ascend_sim::DT_FLOATS, dst, src, count, [](double a) { return 1.0 / std::sqrt(a); });
}
template <typename T>
void Reciprocal(const LocalTensor<T>& dst, const LocalTensor<T>& src, const int32_t& count)
{
    ascend_sim::unary_op("Reciprocal", ascend_sim::DT_FLOATS, dst, src, count, [](double a) { return 1.0 / a; });
}
template <typename T>
void Relu(const LocalTensor<T>& dst, const LocalTensor<T>& src, const int32_t& count)
{
    ascend_sim::unary_op("Relu", ascend_sim::DT_RELU, dst, src, count, [](double a) { return ascend_sim::vmax(a, 0.0); });
}
template <typename T>
void Abs(const LocalTensor<T>& dst, const LocalTensor<T>& src, const int32_t& count)
{
    ascend_sim::unary_op("Abs", ascend_sim::DT_FLOATS, dst, src, count, [](double a) { return std::fabs(a); });
}

/* ---- Bitwise (section 2.2): int16 / uint16 only on A2 ---- */
template <typename T>
void And(const LocalTensor<T>& dst, const LocalTensor<T>& src0, const LocalTensor<T>& src1, const int32_t& count)
{
    ascend_sim::binary_op("And", ascend_sim::DT_I16 | ascend_sim::DT_U16, dst, src0, src1, count, [](double a, double b) {
        return static_cast<double>(static_cast<T>(static_cast<uint16_t>(static_cast<int64_t>(a) & static_cast<int64_t>(b))));
    });
}
template <typename T>
void Or(const LocalTensor<T>& dst, const LocalTensor<T>& src0, const LocalTensor<T>& src1, const int32_t& count)
{
    ascend_sim::binary_op("Or", ascend_sim::DT_I16 | ascend_sim::DT_U16, dst, src0, src1, count, [](double a, double b) {
        return static_cast<double>(static_cast<T>(static_cast<uint16_t>(static_cast<int64_t>(a) | static_cast<int64_t>(b))));
    });
}
template <typename T>
void Not(const LocalTensor<T>& dst, const LocalTensor<T>& src, const int32_t& count)
{
    ascend_sim::unary_op("Not", ascend_sim::DT_I16 | ascend_sim::DT_U16, dst, src, count, [](double a) {
        return static_cast<double>(static_cast<T>(static_cast<uint16_t>(~static_cast<int64_t>(a))));
    });
}

/* ---- Duplicate (section 2.2): fill ---- */
template <typename T>
void Duplicate(const LocalTensor<T>& dst, const T& scalarValue, const int32_t& count)
{
    using namespace ascend_sim;
    const char* api = "Duplicate";
    CoreCtx& c = core();
    check_dtype<T>(api, DT_DUP);
    const uint64_t n = check_count(count, api);
    if (n == 0) return;
    uint8_t* d = ub_operand(c, dst, n, api, "dst", true);
    touch(c, dst, n * sizeof(T), P_V, true, ++c.seq, api, "dst");
    for (uint64_t i = 0; i < n; ++i) st<T>(d + i * sizeof(T), scalarValue);
}

} // namespace AscendC

/* ---- Cast (section 2.3) ---- */
namespace ascend_sim {

/* Neighbours of a 16-bit float pattern in value order (for directed rounding). */
inline uint16_t f16ish_next_up(uint16_t b)
{
    if (b == 0x8000u) return 1u;          /* -0 -> smallest positive */
    return (b & 0x8000u) ? static_cast<uint16_t>(b - 1u) : static_cast<uint16_t>(b + 1u);
}
inline uint16_t f16ish_next_down(uint16_t b)
{
    if (b == 0u) return 0x8001u;          /* +0 -> smallest negative */
    return (b & 0x8000u) ? static_cast<uint16_t>(b + 1u) : static_cast<uint16_t>(b - 1u);
}

/* float -> 16-bit format with an A2 rounding mode. `overflow` = the value one step above the
 * largest finite number (used to decide round-to-nearest overflow like IEEE does). */
template <uint16_t (*FromF32)(float), float (*ToF32)(uint16_t)>
uint16_t round_to_16(float f, AscendC::RoundMode mode, double overflow)
{
    using AscendC::RoundMode;
    const uint16_t rne = FromF32(f);
    if (f != f) return rne;
    const float back = ToF32(rne);
    if (back == f) return rne;
    uint16_t lo, hi;
    if (back < f) {
        lo = rne;
        hi = f16ish_next_up(rne);
    } else {
        hi = rne;
        lo = f16ish_next_down(rne);
    }
    auto val = [&](uint16_t b) {
        const double v = ToF32(b);
        if (std::isinf(v)) return v > 0 ? overflow : -overflow;
        return v;
    };
    switch (mode) {
        case RoundMode::CAST_FLOOR: return lo;
        case RoundMode::CAST_CEIL: return hi;
        case RoundMode::CAST_TRUNC: return f > 0 ? lo : hi;
        case RoundMode::CAST_ODD: return (lo & 1u) ? lo : hi;
        case RoundMode::CAST_ROUND: {
            const double dl = static_cast<double>(f) - val(lo), dh = val(hi) - static_cast<double>(f);
            if (dl < dh) return lo;
            if (dh < dl) return hi;
            return f > 0 ? hi : lo; /* ties away from zero */
        }
        default: return rne; /* CAST_RINT, CAST_NONE */
    }
}

inline uint16_t f16_bits_from(float f) { return f16_from_f32(f); }
inline float f16_to(uint16_t b) { return f32_from_f16(b); }
inline uint16_t bf16_bits_from(float f) { return bf16_from_f32(f); }
inline float bf16_to(uint16_t b) { return f32_from_bf16(b); }

inline double round_int(double v, AscendC::RoundMode mode)
{
    using AscendC::RoundMode;
    switch (mode) {
        case RoundMode::CAST_FLOOR: return std::floor(v);
        case RoundMode::CAST_CEIL: return std::ceil(v);
        case RoundMode::CAST_TRUNC: return std::trunc(v);
        case RoundMode::CAST_ROUND: return std::round(v);
        default: { /* half to even, independent of the FP environment */
            const double fl = std::floor(v), diff = v - fl;
            if (diff > 0.5) return fl + 1;
            if (diff < 0.5) return fl;
            return std::fmod(fl, 2.0) == 0 ? fl : fl + 1;
        }
    }
}

inline const char* round_name(AscendC::RoundMode m)
{
    static const char* const names[] = {"CAST_NONE",  "CAST_RINT",  "CAST_FLOOR", "CAST_CEIL",
                                        "CAST_ROUND", "CAST_TRUNC", "CAST_ODD",   "CAST_HYBRID"};
    return static_cast<unsigned>(m) < 8 ? names[static_cast<unsigned>(m)] : "?";
}

/* Rounding modes A2 allows for (Tout, Tin), as a bit set over RoundMode (section 2.3 and the A2
 * table of VEC/类型转换/Cast.md); 0 = the pair does not exist on A2 / in the sim. */
template <class TO, class TI>
constexpr uint32_t cast_modes()
{
    using AscendC::RoundMode;
    constexpr uint32_t NONE = 1u << static_cast<int>(RoundMode::CAST_NONE);
    constexpr uint32_t DIRECTED = (1u << static_cast<int>(RoundMode::CAST_RINT)) |
                                  (1u << static_cast<int>(RoundMode::CAST_FLOOR)) |
                                  (1u << static_cast<int>(RoundMode::CAST_CEIL)) |
                                  (1u << static_cast<int>(RoundMode::CAST_ROUND)) |
                                  (1u << static_cast<int>(RoundMode::CAST_TRUNC));
    constexpr uint32_t ODD = 1u << static_cast<int>(RoundMode::CAST_ODD);
    if constexpr (std::is_same_v<TI, half> && std::is_same_v<TO, float>) return NONE;
    else if constexpr (std::is_same_v<TI, float> && std::is_same_v<TO, half>) return DIRECTED | ODD | NONE;
    else if constexpr (std::is_same_v<TI, bfloat16_t> && std::is_same_v<TO, float>) return NONE;
    else if constexpr (std::is_same_v<TI, float> && std::is_same_v<TO, bfloat16_t>) return DIRECTED;
    else if constexpr (std::is_same_v<TI, float> && std::is_same_v<TO, int32_t>) return DIRECTED;
    else if constexpr (std::is_same_v<TI, float> && std::is_same_v<TO, float>) return DIRECTED;
    else if constexpr (std::is_same_v<TI, int32_t> && std::is_same_v<TO, float>) return DIRECTED | NONE;
    else if constexpr (std::is_same_v<TI, half> && std::is_same_v<TO, int32_t>) return DIRECTED;
    else if constexpr (std::is_same_v<TI, bfloat16_t> && std::is_same_v<TO, int32_t>) return DIRECTED;
    /* the integer pairs of kernel_operator_vec_vconv_impl.h (dav_c220) */
    else if constexpr (std::is_same_v<TI, int64_t> && std::is_same_v<TO, float>) return DIRECTED;
    else if constexpr (std::is_same_v<TI, float> && std::is_same_v<TO, int64_t>) return DIRECTED;
    else if constexpr (std::is_same_v<TI, int64_t> && std::is_same_v<TO, int32_t>) return NONE;
    else if constexpr (std::is_same_v<TI, int32_t> && std::is_same_v<TO, int64_t>) return NONE;
    else if constexpr (std::is_same_v<TI, uint8_t> && std::is_same_v<TO, half>) return NONE;
    else if constexpr (std::is_same_v<TI, half> && std::is_same_v<TO, uint8_t>) return DIRECTED | NONE;
    else return 0;
}

template <class TO, class TI>
TO cast_value(TI v, AscendC::RoundMode mode)
{
    if constexpr (std::is_same_v<TO, half>) {
        return half::from_bits(round_to_16<f16_bits_from, f16_to>(static_cast<float>(v), mode, 65536.0));
    } else if constexpr (std::is_same_v<TO, bfloat16_t>) {
        return bfloat16_t::from_bits(round_to_16<bf16_bits_from, bf16_to>(static_cast<float>(v), mode, 0x1p128));
    } else if constexpr (std::is_integral_v<TO>) {
        /* saturating, NaN -> 0 (from_num); int64 beyond 2^53 is inexact in the emulation */
        return from_num<TO>(round_int(to_num(v), mode));
    } else if constexpr (std::is_same_v<TO, float> && std::is_same_v<TI, float>) {
        return static_cast<float>(round_int(v, mode));
    } else if constexpr (std::is_same_v<TO, float> && (std::is_same_v<TI, int32_t> || std::is_same_v<TI, int64_t>)) {
        /* int32 / int64 -> float: exact in double (int64 below 2^53), then directed rounding */
        const double d = static_cast<double>(v);
        const float n = static_cast<float>(d); /* nearest even */
        if (static_cast<double>(n) == d || mode == AscendC::RoundMode::CAST_NONE || mode == AscendC::RoundMode::CAST_RINT) {
            return n;
        }
        const float lo = static_cast<double>(n) < d ? n : std::nextafter(n, -INFINITY);
        const float hi = static_cast<double>(n) > d ? n : std::nextafter(n, INFINITY);
        switch (mode) {
            case AscendC::RoundMode::CAST_FLOOR: return lo;
            case AscendC::RoundMode::CAST_CEIL: return hi;
            case AscendC::RoundMode::CAST_TRUNC: return d > 0 ? lo : hi;
            default: {
                const double dl = d - static_cast<double>(lo), dh = static_cast<double>(hi) - d;
                return dl < dh ? lo : (dh < dl ? hi : (d > 0 ? hi : lo));
            }
        }
    } else {
        return static_cast<TO>(static_cast<float>(v)); /* widening: exact */
    }
}

} // namespace ascend_sim

namespace AscendC {

/* Cast<Tout, Tin>(dst, src, mode, count). Widening in place corrupts data on hardware, so any
 * overlap between operands of different sizes is rejected. */
template <typename T, typename U>
void Cast(const LocalTensor<T>& dst, const LocalTensor<U>& src, const RoundMode& round_mode, const uint32_t count)
{
    using namespace ascend_sim;
    const char* api = "Cast";
    CoreCtx& c = core();
    constexpr uint32_t modes = cast_modes<T, U>();
    if constexpr ((std::is_same_v<T, half> && std::is_same_v<U, bfloat16_t>) ||
                  (std::is_same_v<T, bfloat16_t> && std::is_same_v<U, half>)) {
        failf("Cast<", type_name<T>(), ", ", type_name<U>(),
              ">: there is no direct half <-> bfloat16_t conversion on A2; cast through float (section 2.3)");
    }
    if (modes == 0) {
        failf("Cast<", type_name<T>(), ", ", type_name<U>(), ">: ", type_name<U>(), " -> ", type_name<T>(),
              " is not supported (A2 table of section 2.3, or not emulated)");
    }
    if (!(modes & (1u << static_cast<unsigned>(round_mode)))) {
        failf("Cast<", type_name<T>(), ", ", type_name<U>(), ">: rounding mode ", round_name(round_mode),
              " is not allowed for ", type_name<U>(), " -> ", type_name<T>(), " on A2 (section 2.3)");
    }
    const uint64_t n = count;
    if (n == 0) return;
    uint8_t* d = ub_operand(c, dst, n, api, "dst", true);
    const uint8_t* s = ub_operand(c, src, n, api, "src", false);
    check_overlap(dst, n, src, n, api, "src");
    const uint64_t seq = ++c.seq;
    touch(c, src, n * sizeof(U), P_V, false, seq, api, "src");
    touch(c, dst, n * sizeof(T), P_V, true, seq, api, "dst");
    for (uint64_t i = 0; i < n; ++i) {
        st<T>(d + i * sizeof(T), cast_value<T, U>(ld<U>(s + i * sizeof(U)), round_mode));
    }
}

} // namespace AscendC

/* ---- Reductions, count form (section 2.4) ---- */
namespace ascend_sim {

/* A2 order: binary tree inside each 256-byte repeat (adjacent pairs, each partial rounded to T),
 * repeats accumulated sequentially. */
template <class T>
T reduce_sum_a2(const uint8_t* s, uint64_t n)
{
    const uint64_t perRep = 256 / sizeof(T);
    double acc = 0;
    std::vector<double> v;
    for (uint64_t r0 = 0; r0 < n; r0 += perRep) {
        const uint64_t e = std::min<uint64_t>(perRep, n - r0);
        v.assign(e, 0.0);
        for (uint64_t i = 0; i < e; ++i) v[i] = to_num(ld<T>(s + (r0 + i) * sizeof(T)));
        for (uint64_t len = e; len > 1;) {
            const uint64_t next = (len + 1) / 2;
            for (uint64_t i = 0; i < len / 2; ++i) v[i] = to_num(from_num<T>(v[2 * i] + v[2 * i + 1]));
            if (len % 2) v[len / 2] = v[len - 1];
            len = next;
        }
        acc = (r0 == 0) ? v[0] : to_num(from_num<T>(acc + v[0]));
    }
    return from_num<T>(acc);
}

/* Minimum sharedTmpBuffer elements of ReduceMax/ReduceMin (ReduceMax.md, 关键特性说明). */
template <class T>
uint64_t reduce_max_tmp_elems(uint64_t count, bool calIndex)
{
    const uint64_t perRep = 256 / sizeof(T), perBlk = 32 / sizeof(T);
    auto up = [](uint64_t a, uint64_t b) { return (a + b - 1) / b * b; };
    const uint64_t rep1 = std::max<uint64_t>(1, (count + perRep - 1) / perRep);
    const uint64_t out1 = rep1 * 2;
    if (!calIndex) return up(out1, perBlk);
    const uint64_t start2 = up(out1, perBlk);
    const uint64_t out2 = (out1 + perRep - 1) / perRep * 2;
    const uint64_t end2 = up(out2, perBlk);
    if (out2 <= 2) return start2 + end2;
    const uint64_t out3 = (out2 + perRep - 1) / perRep * 2;
    return start2 + end2 + up(out3, perBlk);
}

template <class T>
void reduce_max_min(const char* api, bool isMax, const AscendC::LocalTensor<T>& dst,
                    const AscendC::LocalTensor<T>& src, const AscendC::LocalTensor<T>& tmp, int64_t count,
                    bool calIndex)
{
    CoreCtx& c = core();
    check_dtype<T>(api, DT_FLOATS);
    const uint64_t n = check_count(count, api);
    if (n == 0) return; /* NOP on A2 */
    const uint64_t need = reduce_max_tmp_elems<T>(n, calIndex);
    const uint64_t dn = calIndex ? 2 : 1;
    /* dst alignment: the element size, 4 B (half) / 8 B (float) with the index (section 2.4) */
    uint8_t* d = ub_operand(c, dst, dn, api, "dst", true, static_cast<uint32_t>(sizeof(T) * dn));
    const uint8_t* s = ub_operand(c, src, n, api, "src", false);
    if (tmp.GetSize() < need) {
        failf(api, ": sharedTmpBuffer has ", tmp.GetSize(), " elements, needs at least ", need, " for count ", n,
              calIndex ? " with index" : "", " (section 2.4)");
    }
    uint8_t* t = ub_operand(c, tmp, need, api, "sharedTmpBuffer", true);
    check_overlap(dst, dn, src, n, api, "src");
    check_overlap(tmp, need, src, n, api, "src");
    const uint64_t seq = ++c.seq;
    touch(c, src, n * sizeof(T), P_V, false, seq, api, "src");
    touch(c, tmp, need * sizeof(T), P_V, true, seq, api, "sharedTmpBuffer");
    touch(c, dst, dn * sizeof(T), P_V, true, seq, api, "dst");
    double best = to_num(ld<T>(s));
    uint64_t at = 0;
    for (uint64_t i = 1; i < n; ++i) {
        const double v = to_num(ld<T>(s + i * sizeof(T)));
        if (isMax ? v > best : v < best) { /* ties keep the smallest index */
            best = v;
            at = i;
        }
    }
    std::memset(t, kPoison, need * sizeof(T)); /* the instruction clobbers the temporary */
    st<T>(d, from_num<T>(best));
    if (calIndex) {
        /* the index is stored in T's bit pattern; reinterpret it as an integer to read it */
        if constexpr (sizeof(T) == 2) st<uint16_t>(d + sizeof(T), static_cast<uint16_t>(at));
        else st<uint32_t>(d + sizeof(T), static_cast<uint32_t>(at));
    }
}

} // namespace ascend_sim

namespace AscendC {

/* ReduceSum: dst[0] = sum of count elements. On A2 the count form does not use sharedTmpBuffer
 * (any size; it must still be a valid UB tensor). */
template <typename T>
void ReduceSum(const LocalTensor<T>& dst, const LocalTensor<T>& src, const LocalTensor<T>& sharedTmpBuffer,
               const int32_t count)
{
    using namespace ascend_sim;
    const char* api = "ReduceSum";
    CoreCtx& c = core();
    check_dtype<T>(api, DT_FLOATS);
    const uint64_t n = check_count(count, api);
    if (n == 0) return;
    uint8_t* d = ub_operand(c, dst, 1, api, "dst", true, sizeof(T));
    const uint8_t* s = ub_operand(c, src, n, api, "src", false);
    ub_operand(c, sharedTmpBuffer, 0, api, "sharedTmpBuffer", false);
    check_overlap(dst, 1, src, n, api, "src");
    const uint64_t seq = ++c.seq;
    touch(c, src, n * sizeof(T), P_V, false, seq, api, "src");
    touch(c, dst, sizeof(T), P_V, true, seq, api, "dst");
    st<T>(d, reduce_sum_a2<T>(s, n));
}

/* ReduceMax: dst[0] = max, dst[1] = its index (smallest on ties) when calIndex. */
template <typename T>
void ReduceMax(const LocalTensor<T>& dst, const LocalTensor<T>& src, const LocalTensor<T>& sharedTmpBuffer,
               const int32_t count, bool calIndex = false)
{
    ascend_sim::reduce_max_min("ReduceMax", true, dst, src, sharedTmpBuffer, count, calIndex);
}

template <typename T>
void ReduceMin(const LocalTensor<T>& dst, const LocalTensor<T>& src, const LocalTensor<T>& sharedTmpBuffer,
               const int32_t count, bool calIndex = false)
{
    ascend_sim::reduce_max_min("ReduceMin", false, dst, src, sharedTmpBuffer, count, calIndex);
}

} // namespace AscendC

#endif // ASCEND_SIM_KERNEL_OPERATOR_VEC_INTF_H
