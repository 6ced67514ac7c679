/*
 * ascend-sim: qualifiers, macros and value types of the Ascend C subset (docs/ascend-c.md
 * sections 1.2, 1.3, 1.7, 2.3 and 11.1), implemented for the host.
 *
 * Everything here is our own host implementation; only the names and the documented
 * semantics follow the Ascend C documentation.
 */
#ifndef ASCEND_SIM_SIM_TYPES_H
#define ASCEND_SIM_SIM_TYPES_H

#if __cplusplus < 201703L
#error "ascend-sim: kernel_operator.h needs C++17 (the bisheng wrapper passes -std=c++17)"
#endif

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

/* ---- Qualifiers (section 1.2, 11.1): nothing on the host. ---- */
#define __global__
#define __aicore__
#define __gm__
#define __ubuf__
#define __vector__
#define __cube__
#define __mix__(c, v)
/* Marks the workspace parameter whose argument the launch loads into the kfc workspace register
 * (the bisheng wrapper finds it in the kernel's definition). */
#define __kfc_workspace__
#define __schedmode__(m)
#define __inout_pipe__(p)
#define __in_pipe__(p)
#define __out_pipe__(p)
/* `__inline__` is deliberately NOT redefined: it is GCC's spelling of `inline`, which is also
 * what it means for bisheng; emptying it would turn inline helpers in headers into ODR errors. */

#ifndef GM_ADDR
#define GM_ADDR __gm__ uint8_t*
#endif

#ifndef __NPU_ARCH__
#define __NPU_ARCH__ 2201
#endif
#ifndef ASCEND_SIM
#define ASCEND_SIM 1
#endif

/* Physical sizes of the per-core memories of an Atlas A2 core (section 8). */
#define ASC_UB_SIZE 196352
#define ASC_L1_SIZE 524032
#define ASC_L0A_SIZE 65536
#define ASC_L0B_SIZE 65536
#define ASC_L0C_SIZE 131072
#define ASC_BT_SIZE 1024

/* Emulated GetLibApiWorkSpaceSize(): the Matmul system workspace (section 3.1). */
#ifndef ASCEND_SIM_SYS_WORKSPACE
#define ASCEND_SIM_SYS_WORKSPACE (16u * 1024u * 1024u)
#endif

/* ---- Kernel types (section 1.2): the six values A2 accepts, then the rest of the enum. ---- */
enum KernelMetaType : uint8_t {
    KERNEL_TYPE_AIV_ONLY,
    KERNEL_TYPE_AIC_ONLY,
    KERNEL_TYPE_MIX_AIV_1_0,
    KERNEL_TYPE_MIX_AIC_1_0,
    KERNEL_TYPE_MIX_AIC_1_1,
    KERNEL_TYPE_MIX_AIC_1_2,
    KERNEL_TYPE_AICORE,
    KERNEL_TYPE_VECTORCORE,
    KERNEL_TYPE_MIX_AICORE,
    KERNEL_TYPE_MIX_VECTOR_CORE,
    KERNEL_TYPE_MAX,
};

/* The kernel type is known from the launch (the bisheng wrapper reads it from the source), so
 * the macros are no-ops at run time; the argument is still evaluated so typos fail to compile. */
#define KERNEL_TASK_TYPE_DEFAULT(t) ((void)(t))
#define KERNEL_TASK_TYPE(key, t) ((void)(key), (void)(t))

/* ---- Pipes (section 1.1, 1.7) ---- */
enum pipe_t : int32_t {
    PIPE_S = 0,
    PIPE_V,
    PIPE_M,
    PIPE_MTE1,
    PIPE_MTE2,
    PIPE_MTE3,
    PIPE_ALL,
    PIPE_MTE4,
    PIPE_MTE5,
    PIPE_V2,
    PIPE_FIX,
};

enum event_t : int32_t {
    EVENT_ID0 = 0,
    EVENT_ID1,
    EVENT_ID2,
    EVENT_ID3,
    EVENT_ID4,
    EVENT_ID5,
    EVENT_ID6,
    EVENT_ID7,
};

/* ---- 16-bit floating point formats ---- */
namespace ascend_sim {

inline uint32_t f32_bits(float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; }
inline float f32_from_bits(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }

/* IEEE binary16 from float, round to nearest even (integer arithmetic, independent of the FP
 * environment). */
inline uint16_t f16_from_f32(float f)
{
    const uint32_t x = f32_bits(f);
    const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
    const uint32_t ax = x & 0x7fffffffu;
    if (ax >= 0x7f800000u) { /* inf or NaN (keep NaN quiet) */
        return static_cast<uint16_t>(sign | 0x7c00u | (ax > 0x7f800000u ? (0x200u | ((ax >> 13) & 0x3ffu)) : 0u));
    }
    if (ax >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u); /* >= 65520 rounds to inf */
    if (ax < 0x38800000u) {                                               /* half subnormal or zero */
        if (ax < 0x33000000u) return sign;                                 /* <= 2^-25 rounds to 0 */
        const uint32_t e = ax >> 23;
        const uint32_t mant = (ax & 0x7fffffu) | 0x800000u;
        const uint32_t shift = 126u - e; /* value / 2^-24 = mant * 2^(e - 126) */
        uint32_t q = mant >> shift;
        const uint32_t r = mant & ((1u << shift) - 1u);
        const uint32_t halfway = 1u << (shift - 1u);
        if (r > halfway || (r == halfway && (q & 1u))) ++q;
        return static_cast<uint16_t>(sign | q);
    }
    const uint32_t e = (ax >> 23) - 127u + 15u;
    const uint32_t mant = ax & 0x7fffffu;
    uint32_t h = (e << 10) | (mant >> 13);
    const uint32_t rem = mant & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;
    return static_cast<uint16_t>(sign | h);
}

inline float f32_from_f16(uint16_t h)
{
    const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
    const uint32_t e = (h >> 10) & 0x1fu;
    const uint32_t m = h & 0x3ffu;
    if (e == 0) {
        const float v = static_cast<float>(m) * 5.9604644775390625e-8f; /* m * 2^-24, exact */
        return sign ? -v : v;
    }
    if (e == 31) return f32_from_bits(sign | 0x7f800000u | (m << 13));
    return f32_from_bits(sign | ((e - 15u + 127u) << 23) | (m << 13));
}

/* bfloat16 = the upper half of a float; round to nearest even. */
inline uint16_t bf16_from_f32(float f)
{
    const uint32_t x = f32_bits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40u); /* quiet NaN */
    const uint32_t rounded = x + 0x7fffu + ((x >> 16) & 1u);
    return static_cast<uint16_t>(rounded >> 16);
}

inline float f32_from_bf16(uint16_t b) { return f32_from_bits(static_cast<uint32_t>(b) << 16); }

} // namespace ascend_sim

/* `half`: IEEE binary16 value type. Arithmetic goes through float (implicit conversions both
 * ways), so `half c = a + b;` rounds the float result to nearest even. */
struct half {
    uint16_t bits_;

    half() = default;
    template <class U, std::enable_if_t<std::is_arithmetic_v<U>, int> = 0>
    half(U v) : bits_(::ascend_sim::f16_from_f32(static_cast<float>(v)))
    {}
    operator float() const { return ::ascend_sim::f32_from_f16(bits_); }
    static half from_bits(uint16_t b) { half h; h.bits_ = b; return h; }
    uint16_t to_bits() const { return bits_; }

    half& operator+=(float v) { return *this = half(float(*this) + v); }
    half& operator-=(float v) { return *this = half(float(*this) - v); }
    half& operator*=(float v) { return *this = half(float(*this) * v); }
    half& operator/=(float v) { return *this = half(float(*this) / v); }
};
static_assert(sizeof(half) == 2 && std::is_trivially_copyable_v<half>, "half must be a 2-byte POD");

/* `bfloat16_t`: bfloat16 value type, same conventions as `half`. */
struct bfloat16_t {
    uint16_t bits_;

    bfloat16_t() = default;
    template <class U, std::enable_if_t<std::is_arithmetic_v<U>, int> = 0>
    bfloat16_t(U v) : bits_(::ascend_sim::bf16_from_f32(static_cast<float>(v)))
    {}
    operator float() const { return ::ascend_sim::f32_from_bf16(bits_); }
    static bfloat16_t from_bits(uint16_t b) { bfloat16_t h; h.bits_ = b; return h; }
    uint16_t to_bits() const { return bits_; }

    bfloat16_t& operator+=(float v) { return *this = bfloat16_t(float(*this) + v); }
    bfloat16_t& operator-=(float v) { return *this = bfloat16_t(float(*this) - v); }
    bfloat16_t& operator*=(float v) { return *this = bfloat16_t(float(*this) * v); }
    bfloat16_t& operator/=(float v) { return *this = bfloat16_t(float(*this) / v); }
};
static_assert(sizeof(bfloat16_t) == 2 && std::is_trivially_copyable_v<bfloat16_t>, "bfloat16_t must be a 2-byte POD");

/* CubeFormat lives in the global namespace in the toolkit (matmul_config.h). */
enum class CubeFormat { ND = 0, NZ, ZN, ZZ, NN, ND_ALIGN, SCALAR, VECTOR };

namespace AscendC {

/* Logical positions (section 1.3; enum order of BASIC/辅助数据结构/TPosition.md). */
enum class TPosition : uint8_t {
    GM,
    A1,
    A2,
    B1,
    B2,
    C1,
    C2,
    CO1,
    CO2,
    VECIN,
    VECOUT,
    VECCALC,
    LCM = VECCALC,
    SPM,
    SHM = SPM,
    TSCM,
    C2PIPE2GM,
    C2PIPE2LOCAL,
    MAX,
};
using QuePosition = TPosition;

/* Hardware events, named SRC_DST (section 1.7). */
enum class HardEvent : uint8_t {
    MTE2_MTE1,
    MTE1_MTE2,
    MTE1_M,
    M_MTE1,
    MTE2_V,
    V_MTE2,
    MTE3_V,
    V_MTE3,
    M_V,
    V_M,
    V_V,
    MTE3_MTE1,
    MTE1_MTE3,
    MTE1_V,
    MTE2_M,
    M_MTE2,
    V_MTE1,
    M_FIX,
    FIX_M,
    MTE3_MTE2,
    MTE2_MTE3,
    S_V,
    V_S,
    S_MTE2,
    MTE2_S,
    S_MTE3,
    MTE3_S,
    MTE2_FIX,
    FIX_MTE2,
    FIX_S,
    M_S,
    FIX_MTE3,
    MTE1_FIX,
    FIX_MTE1,
    FIX_FIX,
    MAX,
};

using TEventID = int8_t;

/* Cast rounding modes (section 2.3). */
enum class RoundMode : uint8_t {
    CAST_NONE = 0,
    CAST_RINT,
    CAST_FLOOR,
    CAST_CEIL,
    CAST_ROUND,
    CAST_TRUNC,
    CAST_ODD,
    CAST_HYBRID,
};

enum class CMPMODE : uint8_t { LT = 0, GT, EQ, LE, GE, NE };
enum class SELMODE : uint8_t { VSEL_CMPMASK_SPR = 0, VSEL_TENSOR_SCALAR_MODE, VSEL_TENSOR_TENSOR_MODE };
enum class ReduceOrder : uint8_t { ORDER_VALUE_INDEX = 0, ORDER_INDEX_VALUE, ORDER_ONLY_VALUE, ORDER_ONLY_INDEX };
enum class KernelMode : uint8_t { MIX_MODE = 0, AIC_MODE, AIV_MODE };

/* Core types: the value of `g_coreType` (section 1.2). */
enum CoreTypeValue : int32_t { AIC = 1, AIV = 2 };

using ::CubeFormat;

} // namespace AscendC

#endif // ASCEND_SIM_SIM_TYPES_H
