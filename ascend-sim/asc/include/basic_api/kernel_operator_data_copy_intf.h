/*
 * ascend-sim: DataCopy / DataCopyPad between GM and UB and within UB (docs/ascend-c.md 1.6,
 * 11.5; invariants 11.8 items 2, 3, 4, 6).
 *
 * Pipes: GM -> UB is MTE2, UB -> GM is MTE3, UB -> UB is V (vector copy).
 */
#ifndef ASCEND_SIM_KERNEL_OPERATOR_DATA_COPY_INTF_H
#define ASCEND_SIM_KERNEL_OPERATOR_DATA_COPY_INTF_H

#include "kernel_tensor.h"

namespace AscendC {

/* Strided copy parameters, all in 32-byte blocks (section 1.6). */
struct DataCopyParams {
    DataCopyParams() {}
    DataCopyParams(const uint16_t count, const uint16_t len, const uint16_t srcStrideIn, const uint16_t dstStrideIn)
        : blockCount(count), blockLen(len), srcStride(srcStrideIn), dstStride(dstStrideIn)
    {}
    uint16_t blockCount = 1;
    uint16_t blockLen = 0;
    union {
        uint16_t srcGap = 0;
        uint16_t srcStride;
    };
    union {
        uint16_t dstGap = 0;
        uint16_t dstStride;
    };
};

/* DataCopyPad parameters: blockLen in bytes; GM stride in bytes, UB stride in 32-byte blocks. */
struct DataCopyExtParams {
    DataCopyExtParams() {}
    DataCopyExtParams(const uint16_t count, const uint32_t len, const uint32_t srcStrideIn, const uint32_t dstStrideIn,
                      const uint32_t rsvIn)
        : blockCount(count), blockLen(len), srcStride(srcStrideIn), dstStride(dstStrideIn), rsv(rsvIn)
    {}
    uint16_t blockCount = 1;
    uint32_t blockLen = 0;
    uint32_t srcStride = 0;
    uint32_t dstStride = 0;
    uint32_t rsv = 0;
};

template <typename T>
struct DataCopyPadExtParams {
    DataCopyPadExtParams() {}
    DataCopyPadExtParams(const bool isPadValue, const uint8_t leftPadValue, const uint8_t rightPadValue, T padValue)
        : isPad(isPadValue), leftPadding(leftPadValue), rightPadding(rightPadValue), paddingValue(padValue)
    {}
    bool isPad = false;
    uint8_t leftPadding = 0;
    uint8_t rightPadding = 0;
    T paddingValue = T(0);
};

} // namespace AscendC

namespace ascend_sim {

constexpr uint32_t kMaxBlockCount = 4095;      /* DataCopy(Pad) blockCount range (section 1.6) */
constexpr uint32_t kMaxPadBlockLen = 2097151;  /* DataCopyExtParams.blockLen range, bytes */

inline uint64_t round32(uint64_t v) { return (v + 31u) / 32u * 32u; }

template <class T>
void check_gm_align(const AscendC::GlobalTensor<T>& g, const char* api)
{
    const uintptr_t a = reinterpret_cast<uintptr_t>(g.addr());
    if (a % sizeof(T) != 0) {
        failf(api, ": GM address ", Hex{a}, " is not aligned to sizeof(", type_name<T>(), ") = ", sizeof(T));
    }
}

/* UB -> GM store of `bytes` bytes, plain or accumulating (SetAtomicAdd<T>). */
template <class T>
void gm_store(CoreCtx& c, uint8_t* gm, const uint8_t* ub, uint64_t bytes, const char* api)
{
    if (c.atomicType == 0) {
        std::memcpy(gm, ub, bytes);
        return;
    }
    if (c.atomicType != type_code<T>()) {
        failf(api, ": SetAtomicAdd was set for another element type than ", type_name<T>());
    }
    gm_atomic_lock();
    for (uint64_t i = 0; i + sizeof(T) <= bytes; i += sizeof(T)) {
        st<T>(gm + i, from_num<T>(to_num(ld<T>(gm + i)) + to_num(ld<T>(ub + i))));
    }
    gm_atomic_unlock();
}

template <class T>
void check_count_form(uint32_t count, const char* api)
{
    const uint64_t bytes = static_cast<uint64_t>(count) * sizeof(T);
    if (bytes % 32 != 0) {
        failf(api, " of ", bytes, " bytes is not a multiple of 32 bytes; use DataCopyPad (count ", count, " x ",
              type_name<T>(), "; the hardware would round down to ", bytes / 32 * 32, " bytes)");
    }
}

inline void check_params(const AscendC::DataCopyParams& p, const char* api)
{
    if (p.blockCount > kMaxBlockCount) failf(api, ": blockCount ", p.blockCount, " > ", kMaxBlockCount);
}

inline void check_ext_params(const AscendC::DataCopyExtParams& p, uint32_t elem, const char* api)
{
    if (p.blockCount > kMaxBlockCount) failf(api, ": blockCount ", p.blockCount, " > ", kMaxBlockCount);
    if (p.blockLen > kMaxPadBlockLen) failf(api, ": blockLen ", p.blockLen, " bytes > ", kMaxPadBlockLen);
    if (p.blockLen % elem != 0) {
        failf(api, ": blockLen ", p.blockLen, " bytes is not a multiple of sizeof(T) = ", elem);
    }
}

} // namespace ascend_sim

namespace AscendC {

/* ---- Contiguous copies (count in elements; count * sizeof(T) must be a multiple of 32). ---- */

template <typename T>
void DataCopy(const LocalTensor<T>& dst, const GlobalTensor<T>& src, const uint32_t count)
{
    using namespace ascend_sim;
    CoreCtx& c = core();
    const char* api = "DataCopy";
    check_count_form<T>(count, api);
    uint8_t* d = ub_operand(c, dst, count, api, "dst (UB)", true);
    check_gm_align(src, api);
    const uint64_t bytes = static_cast<uint64_t>(count) * sizeof(T);
    const uint8_t* s = src.check(0, bytes, api);
    touch(c, dst, bytes, P_MTE2, true, ++c.seq, api, "dst (UB)");
    std::memcpy(d, s, bytes);
}

template <typename T>
void DataCopy(const GlobalTensor<T>& dst, const LocalTensor<T>& src, const uint32_t count)
{
    using namespace ascend_sim;
    CoreCtx& c = core();
    const char* api = "DataCopy";
    check_count_form<T>(count, api);
    const uint8_t* s = ub_operand(c, src, count, api, "src (UB)", false);
    check_gm_align(dst, api);
    const uint64_t bytes = static_cast<uint64_t>(count) * sizeof(T);
    uint8_t* d = dst.check(0, bytes, api);
    touch(c, src, bytes, P_MTE3, false, ++c.seq, api, "src (UB)");
    gm_store<T>(c, d, s, bytes, api);
}

template <typename T>
void DataCopy(const LocalTensor<T>& dst, const LocalTensor<T>& src, const uint32_t count)
{
    using namespace ascend_sim;
    CoreCtx& c = core();
    const char* api = "DataCopy(UB->UB)";
    check_count_form<T>(count, api);
    uint8_t* d = ub_operand(c, dst, count, api, "dst", true);
    const uint8_t* s = ub_operand(c, src, count, api, "src", false);
    check_overlap(dst, count, src, count, api, "src");
    const uint64_t seq = ++c.seq;
    touch(c, src, count * sizeof(T), P_V, false, seq, api, "src");
    touch(c, dst, count * sizeof(T), P_V, true, seq, api, "dst");
    std::memmove(d, s, static_cast<uint64_t>(count) * sizeof(T));
}

/* ---- Strided copies: blockCount blocks of blockLen x 32 bytes, gaps in 32-byte blocks. ---- */

template <typename T>
void DataCopy(const LocalTensor<T>& dst, const GlobalTensor<T>& src, const DataCopyParams& p)
{
    using namespace ascend_sim;
    CoreCtx& c = core();
    const char* api = "DataCopy(GM->UB, DataCopyParams)";
    check_params(p, api);
    if (p.blockCount == 0 || p.blockLen == 0) return;
    const uint64_t blk = p.blockLen * 32ull;
    const uint64_t ubBytes = (p.blockCount - 1ull) * (blk + p.dstGap * 32ull) + blk;
    const uint64_t gmBytes = (p.blockCount - 1ull) * (blk + p.srcGap * 32ull) + blk;
    uint8_t* d = ub_operand(c, dst, (ubBytes + sizeof(T) - 1) / sizeof(T), api, "dst (UB)", true);
    check_gm_align(src, api);
    const uint8_t* s = src.check(0, gmBytes, api);
    const uint64_t seq = ++c.seq;
    for (uint32_t i = 0; i < p.blockCount; ++i) {
        touch_at(c, dst, i * (blk + p.dstGap * 32ull), blk, P_MTE2, true, seq, api, "dst (UB)");
        std::memcpy(d + i * (blk + p.dstGap * 32ull), s + i * (blk + p.srcGap * 32ull), blk);
    }
}

template <typename T>
void DataCopy(const GlobalTensor<T>& dst, const LocalTensor<T>& src, const DataCopyParams& p)
{
    using namespace ascend_sim;
    CoreCtx& c = core();
    const char* api = "DataCopy(UB->GM, DataCopyParams)";
    check_params(p, api);
    if (p.blockCount == 0 || p.blockLen == 0) return;
    const uint64_t blk = p.blockLen * 32ull;
    const uint64_t ubBytes = (p.blockCount - 1ull) * (blk + p.srcGap * 32ull) + blk;
    const uint64_t gmBytes = (p.blockCount - 1ull) * (blk + p.dstGap * 32ull) + blk;
    const uint8_t* s = ub_operand(c, src, (ubBytes + sizeof(T) - 1) / sizeof(T), api, "src (UB)", false);
    check_gm_align(dst, api);
    uint8_t* d = dst.check(0, gmBytes, api);
    const uint64_t seq = ++c.seq;
    for (uint32_t i = 0; i < p.blockCount; ++i) {
        touch_at(c, src, i * (blk + p.srcGap * 32ull), blk, P_MTE3, false, seq, api, "src (UB)");
        gm_store<T>(c, d + i * (blk + p.dstGap * 32ull), s + i * (blk + p.srcGap * 32ull), blk, api);
    }
}

template <typename T>
void DataCopy(const LocalTensor<T>& dst, const LocalTensor<T>& src, const DataCopyParams& p)
{
    using namespace ascend_sim;
    CoreCtx& c = core();
    const char* api = "DataCopy(UB->UB, DataCopyParams)";
    check_params(p, api);
    if (p.blockCount == 0 || p.blockLen == 0) return;
    const uint64_t blk = p.blockLen * 32ull;
    const uint64_t dBytes = (p.blockCount - 1ull) * (blk + p.dstGap * 32ull) + blk;
    const uint64_t sBytes = (p.blockCount - 1ull) * (blk + p.srcGap * 32ull) + blk;
    uint8_t* d = ub_operand(c, dst, (dBytes + sizeof(T) - 1) / sizeof(T), api, "dst", true);
    const uint8_t* s = ub_operand(c, src, (sBytes + sizeof(T) - 1) / sizeof(T), api, "src", false);
    check_overlap(dst, dBytes / sizeof(T), src, sBytes / sizeof(T), api, "src");
    const uint64_t seq = ++c.seq;
    for (uint32_t i = 0; i < p.blockCount; ++i) {
        touch_at(c, src, i * (blk + p.srcGap * 32ull), blk, P_V, false, seq, api, "src");
    }
    for (uint32_t i = 0; i < p.blockCount; ++i) {
        touch_at(c, dst, i * (blk + p.dstGap * 32ull), blk, P_V, true, seq, api, "dst");
    }
    for (uint32_t i = 0; i < p.blockCount; ++i) {
        std::memmove(d + i * (blk + p.dstGap * 32ull), s + i * (blk + p.srcGap * 32ull), blk);
    }
}

/* ---- DataCopyPad (section 1.6): unaligned rows. ---- */

/* GM -> UB: block i is read from GM byte i * (blockLen + srcStride) and written to UB at a 32-byte
 * boundary: [leftPadding][blockLen bytes][rightPadding][dummy up to 32 B], blocks dstStride x 32 B
 * apart. With isPad the pad and dummy lanes get paddingValue, otherwise they keep their contents. */
template <typename T>
void DataCopyPad(const LocalTensor<T>& dst, const GlobalTensor<T>& src, const DataCopyExtParams& p,
                 const DataCopyPadExtParams<T>& pad)
{
    using namespace ascend_sim;
    CoreCtx& c = core();
    const char* api = "DataCopyPad(GM->UB)";
    check_ext_params(p, sizeof(T), api);
    if (pad.leftPadding * sizeof(T) > 32 || pad.rightPadding * sizeof(T) > 32) {
        failf(api, ": leftPadding ", int(pad.leftPadding), " / rightPadding ", int(pad.rightPadding), " x ",
              type_name<T>(), " exceed 32 bytes");
    }
    if (p.blockCount == 0 || p.blockLen == 0) return; /* NOP on A2 */
    const uint64_t left = pad.leftPadding * sizeof(T), right = pad.rightPadding * sizeof(T);
    const uint64_t blockBytes = left + p.blockLen + right;
    const uint64_t ubBlock = round32(blockBytes);
    const uint64_t ubStep = ubBlock + p.dstStride * 32ull;
    const uint64_t ubBytes = (p.blockCount - 1ull) * ubStep + ubBlock;
    const uint64_t gmStep = static_cast<uint64_t>(p.blockLen) + p.srcStride;
    const uint64_t gmBytes = (p.blockCount - 1ull) * gmStep + p.blockLen;
    uint8_t* d = ub_operand(c, dst, ubBytes / sizeof(T), api, "dst (UB)", true);
    const uint8_t* s = src.check(0, gmBytes, api);
    const uint64_t seq = ++c.seq;
    for (uint32_t i = 0; i < p.blockCount; ++i) {
        touch_at(c, dst, i * ubStep, ubBlock, P_MTE2, true, seq, api, "dst (UB)");
        uint8_t* row = d + i * ubStep;
        std::memcpy(row + left, s + i * gmStep, p.blockLen);
        if (pad.isPad) {
            for (uint64_t b = 0; b < left; b += sizeof(T)) st<T>(row + b, pad.paddingValue);
            for (uint64_t b = left + p.blockLen; b < ubBlock; b += sizeof(T)) st<T>(row + b, pad.paddingValue);
        }
    }
}

/* UB -> GM: block i is read from UB at i * (round32(blockLen) + srcStride x 32) and exactly
 * blockLen bytes are written to GM byte i * (blockLen + dstStride). */
template <typename T>
void DataCopyPad(const GlobalTensor<T>& dst, const LocalTensor<T>& src, const DataCopyExtParams& p)
{
    using namespace ascend_sim;
    CoreCtx& c = core();
    const char* api = "DataCopyPad(UB->GM)";
    check_ext_params(p, sizeof(T), api);
    if (p.blockCount == 0 || p.blockLen == 0) return;
    const uint64_t ubStep = round32(p.blockLen) + p.srcStride * 32ull;
    const uint64_t ubBytes = (p.blockCount - 1ull) * ubStep + p.blockLen;
    const uint64_t gmStep = static_cast<uint64_t>(p.blockLen) + p.dstStride;
    const uint64_t gmBytes = (p.blockCount - 1ull) * gmStep + p.blockLen;
    const uint8_t* s = ub_operand(c, src, ubBytes / sizeof(T), api, "src (UB)", false);
    uint8_t* d = dst.check(0, gmBytes, api);
    const uint64_t seq = ++c.seq;
    for (uint32_t i = 0; i < p.blockCount; ++i) {
        touch_at(c, src, i * ubStep, p.blockLen, P_MTE3, false, seq, api, "src (UB)");
        gm_store<T>(c, d + i * gmStep, s + i * ubStep, p.blockLen, api);
    }
}

} // namespace AscendC

#endif // ASCEND_SIM_KERNEL_OPERATOR_DATA_COPY_INTF_H
