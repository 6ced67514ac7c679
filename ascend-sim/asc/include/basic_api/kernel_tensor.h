/*
 * ascend-sim: GlobalTensor / LocalTensor (docs/ascend-c.md 1.5, 11.4) and the operand checks
 * every API runs on them (11.8 items 2, 3, 5, 6).
 *
 * A LocalTensor is a view (byte address + element count) into one buffer record of its core
 * (a TQue block or a TBuf). It carries the record's generation, so a tensor used after
 * FreeTensor or after its TPipe was reset is detected ("use of a freed buffer").
 */
#ifndef ASCEND_SIM_KERNEL_TENSOR_H
#define ASCEND_SIM_KERNEL_TENSOR_H

#include "sim_core.h"

namespace AscendC {

template <class T>
class LocalTensor;

/* ------------------------------------------------------------------------------------------ */
/* GlobalTensor: a typed view of device memory. SetGlobalBuffer checks that the range lies in one
 * aclrtMalloc allocation; every access is bounds-checked against the size given to
 * SetGlobalBuffer (when given) and against that allocation (always). */
template <class T>
class GlobalTensor {
public:
    using PrimType = T;

    GlobalTensor() = default;

    void SetGlobalBuffer(__gm__ T* buffer, uint64_t bufferSize)
    {
        set(buffer, bufferSize, true);
    }
    void SetGlobalBuffer(__gm__ T* buffer) { set(buffer, 0, false); }

    /* Raw GM address of the view (no check: pointer arithmetic is free). */
    const __gm__ T* GetPhyAddr() const { return reinterpret_cast<const T*>(addr()); }
    __gm__ T* GetPhyAddr(const uint64_t offset) const { return reinterpret_cast<T*>(addr() + offset * sizeof(T)); }

    /* Elements from this view to the end of the SetGlobalBuffer size; 0 without a size. */
    uint64_t GetSize() const
    {
        if (!sized_) return 0;
        const uint64_t total = sizeBytes_ / sizeof(T), first = off_ / sizeof(T);
        return first < total ? total - first : 0;
    }

    GlobalTensor operator[](const uint64_t offset) const
    {
        GlobalTensor r = *this;
        r.off_ += offset * sizeof(T);
        return r;
    }

    template <class U>
    GlobalTensor<U> ReinterpretCast() const
    {
        GlobalTensor<U> r;
        r.base_ = base_;
        r.off_ = off_;
        r.sizeBytes_ = sizeBytes_;
        r.sized_ = sized_;
        r.allocBegin_ = allocBegin_;
        r.allocEnd_ = allocEnd_;
        return r;
    }

    /* Scalar GM accesses (PIPE_S). */
    T GetValue(const uint64_t offset) const
    {
        ascend_sim::core();
        return ascend_sim::ld<T>(check(offset * sizeof(T), sizeof(T), "GlobalTensor::GetValue"));
    }
    void SetValue(const uint64_t offset, T value) const
    {
        ascend_sim::core();
        ascend_sim::st<T>(check(offset * sizeof(T), sizeof(T), "GlobalTensor::SetValue"), value);
    }
    __gm__ T& operator()(const uint64_t offset) const
    {
        ascend_sim::core();
        uint8_t* p = check(offset * sizeof(T), sizeof(T), "GlobalTensor::operator()");
        if (reinterpret_cast<uintptr_t>(p) % alignof(T) != 0) {
            ascend_sim::failf("GlobalTensor::operator(): GM address ", ascend_sim::Hex{reinterpret_cast<uintptr_t>(p)},
                              " is not aligned to sizeof(", ascend_sim::type_name<T>(), ")");
        }
        return *reinterpret_cast<T*>(p);
    }

    /* ---- sim internals ---- */
    uint8_t* addr() const { return base_ + off_; }

    /* Host pointer for bytes [byteOff, byteOff + bytes) of this view, after the bounds checks. */
    uint8_t* check(uint64_t byteOff, uint64_t bytes, const char* api) const
    {
        using namespace ascend_sim;
        if (base_ == nullptr) failf(api, ": GlobalTensor used before SetGlobalBuffer (or set to nullptr)");
        const uint64_t first = off_ + byteOff;
        if (sized_ && (first > sizeBytes_ || bytes > sizeBytes_ - first)) {
            failf(api, ": GM access out of bounds: bytes [", first, ", ", first + bytes,
                  ") of a GlobalTensor set with ", sizeBytes_ / sizeof(T), " elements (", sizeBytes_, " bytes)");
        }
        const uintptr_t p = reinterpret_cast<uintptr_t>(base_) + first;
        if (p < allocBegin_ || p + bytes > allocEnd_ || p + bytes < p) {
            failf(api, ": GM access [", Hex{p}, ", +", bytes, " bytes) is outside the device allocation [",
                  Hex{allocBegin_}, ", ", Hex{allocEnd_}, ")");
        }
        return reinterpret_cast<uint8_t*>(p);
    }

    uint8_t* base_ = nullptr;
    uint64_t off_ = 0;       /* bytes from base_ to this view */
    uint64_t sizeBytes_ = 0; /* SetGlobalBuffer size in bytes */
    bool sized_ = false;
    uintptr_t allocBegin_ = 0, allocEnd_ = 0;

private:
    void set(T* buffer, uint64_t n, bool sized)
    {
        using namespace ascend_sim;
        core();
        base_ = reinterpret_cast<uint8_t*>(buffer);
        off_ = 0;
        sized_ = sized;
        sizeBytes_ = n * sizeof(T);
        allocBegin_ = allocEnd_ = 0;
        if (buffer == nullptr) {
            if (sized && n != 0) failf("SetGlobalBuffer(nullptr, ", n, ")");
            return;
        }
        const uint64_t bytes = sized ? sizeBytes_ : 1;
        if (!device_range(buffer, bytes == 0 ? 1 : bytes, &allocBegin_, &allocEnd_)) {
            if (sized) {
                failf("SetGlobalBuffer: [", Hex{reinterpret_cast<uintptr_t>(buffer)}, ", +", sizeBytes_,
                      " bytes) (", n, " x ", type_name<T>(),
                      ") is not inside one device allocation (a host pointer passed to the kernel, or a size "
                      "past the end of the aclrtMalloc buffer)");
            }
            failf("SetGlobalBuffer: ", Hex{reinterpret_cast<uintptr_t>(buffer)},
                  " is not inside a device allocation (a host pointer passed to the kernel?)");
        }
    }
};

/* ------------------------------------------------------------------------------------------ */
/* LocalTensor: a view of an on-chip buffer. */
template <class T>
class LocalTensor {
public:
    using PrimType = T;

    LocalTensor() = default;

    uint32_t GetSize() const { return size_; }
    uint32_t GetLength() const { return size_ * static_cast<uint32_t>(sizeof(T)); }

    void SetSize(const uint32_t size)
    {
        ascend_sim::BufRec& r = rec("LocalTensor::SetSize");
        const uint64_t end = static_cast<uint64_t>(addr_) - r.base + static_cast<uint64_t>(size) * sizeof(T);
        if (end > r.len) {
            ascend_sim::failf("LocalTensor::SetSize(", size, "): ", size, " x ", ascend_sim::type_name<T>(),
                              " from byte ", addr_ - r.base, " exceeds the buffer's ", r.len, " bytes");
        }
        size_ = size;
    }

    /* View starting `offset` elements in (offset < size, section 1.5). */
    LocalTensor operator[](const uint32_t offset) const
    {
        if (offset >= size_) {
            ascend_sim::core();
            ascend_sim::failf("LocalTensor[", offset, "] out of range: the tensor has ", size_, " elements");
        }
        LocalTensor r = *this;
        r.addr_ += offset * static_cast<uint32_t>(sizeof(T));
        r.size_ -= offset;
        return r;
    }

    template <class U>
    LocalTensor<U> ReinterpretCast() const
    {
        LocalTensor<U> r;
        r.buf_ = buf_;
        r.gen_ = gen_;
        r.addr_ = addr_;
        r.size_ = static_cast<uint32_t>(static_cast<uint64_t>(size_) * sizeof(T) / sizeof(U));
        r.tag_ = tag_;
        return r;
    }

    /* Address in the on-chip memory (UB byte address for vector positions). */
    uint64_t GetPhyAddr() const { return addr_; }
    uint64_t GetPhyAddr(const uint32_t offset) const { return addr_ + offset * sizeof(T); }

    TPosition GetPosition() const { return static_cast<TPosition>(rec("LocalTensor::GetPosition").pos); }
    void SetUserTag(int32_t tag) { tag_ = tag; }
    int32_t GetUserTag() const { return tag_; }

    /* Scalar UB accesses (PIPE_S). */
    T GetValue(const uint32_t index) const;
    void SetValue(const uint32_t index, const T value) const;

    /* `x(i)` reads and `x(i) = v` writes through the same checks as GetValue / SetValue. */
    class ElemRef {
    public:
        ElemRef(const LocalTensor& t, uint32_t i) : t_(t), i_(i) {}
        operator T() const { return t_.GetValue(i_); }
        ElemRef& operator=(const T& v)
        {
            t_.SetValue(i_, v);
            return *this;
        }
        ElemRef& operator=(const ElemRef& o) { return *this = static_cast<T>(o); }

    private:
        const LocalTensor& t_;
        uint32_t i_;
    };
    ElemRef operator()(const uint32_t index) const { return ElemRef(*this, index); }

    /* ---- sim internals ---- */
    ascend_sim::BufRec& rec(const char* api) const;

    int32_t buf_ = -1;  /* index into CoreCtx::bufs */
    uint32_t gen_ = 0;  /* generation of the record when this tensor was handed out */
    uint32_t addr_ = 0; /* byte address in its memory */
    uint32_t size_ = 0; /* elements */
    int32_t tag_ = 0;
};

} // namespace AscendC

namespace ascend_sim {

/* Live record of a tensor: initialised, not freed, pipe not torn down. */
inline BufRec& live_rec(CoreCtx& c, int32_t buf, uint32_t gen, const char* api, const char* role)
{
    if (buf < 0 || static_cast<size_t>(buf) >= c.bufs.size()) {
        failf(api, ": ", role, " is an uninitialised LocalTensor (not from AllocTensor / DeQue / TBuf::Get)");
    }
    BufRec& r = c.bufs[static_cast<size_t>(buf)];
    if (r.gen != gen || r.state == BufState::Free || r.state == BufState::Dead) {
        failf(api, ": ", role, ": use of a freed buffer (", mem_name(r.mem), " buffer at ", Hex{r.base}, ", ", r.len,
              " bytes, ",
              r.state == BufState::Dead ? "its TPipe was reset or destroyed"
                                        : "released by FreeTensor; allocate it again",
              ")");
    }
    return r;
}

/* Checks of one vector/DataCopy operand (section 11.8 items 2, 3, 5): live, in UB of an AIV,
 * 32-byte aligned (when required), `elems` elements within the tensor, not written while it is
 * enqueued. Returns the host address of the first element. */
template <class T>
uint8_t* ub_operand(CoreCtx& c, const AscendC::LocalTensor<T>& t, uint64_t elems, const char* api, const char* role,
                    bool write, uint32_t align = 32)
{
    BufRec& r = live_rec(c, t.buf_, t.gen_, api, role);
    if (r.mem != Mem::UB) {
        failf(api, ": ", role, " is in ", mem_name(r.mem), ", the API needs a VECIN/VECOUT/VECCALC (UB) tensor");
    }
    if (c.aic) failf(api, ": ", role, ": UB access on an AIC (the cube core has no Unified Buffer)");
    if (align > 1 && t.addr_ % align != 0) {
        failf(api, ": ", role, " at UB address ", Hex{t.addr_}, " is not ", align, "-byte aligned");
    }
    if (elems > t.size_) {
        failf(api, ": ", role, ": access of ", elems, " x ", type_name<T>(), " exceeds the tensor's ", t.size_,
              " elements");
    }
    if (write && r.state == BufState::Enqueued) {
        failf(api, ": writes ", role, ", a tensor that is enqueued (not yet dequeued); DeQue it first");
    }
    return c.mem[static_cast<int>(Mem::UB)].data() + t.addr_;
}

/* Is an access by pipe `from` at sequence `at` ordered before pipe `to` now? (section 11.8 6)
 * `qSync` is the last queue operation on the buffer. */
inline bool ordered(const CoreCtx& c, uint64_t qSync, uint8_t from, uint8_t to, uint64_t at)
{
    if (from == P_NONE || from == to || at == 0) return true;
#ifndef ASCEND_SIM_NO_AUTO_SYNC
    /* --cce-auto-sync (default for <<<>>> builds) inserts the S <-> V/MTE2/MTE3 waits on the AIV
     * (BASIC/同步控制/核内同步/关键特性说明.md, table 3). */
    if (from == P_S || to == P_S) return true;
#endif
    return at <= c.ordered[from][to] || at <= c.barrierAll || at <= qSync;
}

/* Pipe-hazard tracker: `pipe` reads or writes bytes [addr, addr + bytes) of UB buffer `r` at
 * sequence `seq`. State is kept per 32-byte block, so disjoint slices of one buffer used by
 * different pipes do not conflict. A read after another pipe's write (RAW), a write after another
 * pipe's write (WAW) or read (WAR) is an error unless an ordering point came in between. */
inline void touch(CoreCtx& c, const BufRec& r, uint32_t addr, uint64_t bytes, uint8_t pipe, bool write, uint64_t seq,
                  const char* api, const char* role)
{
    if (bytes == 0 || r.mem != Mem::UB) return;
    if (c.ubHazard.empty()) c.ubHazard.resize(kMemBytes[static_cast<int>(Mem::UB)] / kHazardBlock);
    const size_t b0 = addr / kHazardBlock;
    const size_t b1 = std::min<size_t>((addr + bytes + kHazardBlock - 1) / kHazardBlock, c.ubHazard.size());
    auto where = [&](uint8_t from) {
        return msg(" (", api, " ", role, ", ", mem_name(r.mem), " buffer at ", Hex{r.base}, ", ", r.len,
                   " bytes); add SetFlag/WaitFlag<HardEvent::", pipe_name(from), "_", pipe_name(pipe),
                   "> or a queue EnQue/DeQue between them");
    };
#ifndef ASCEND_SIM_NO_AUTO_SYNC
    /* The wait --cce-auto-sync inserts before a scalar access blocks the scalar unit, which issues
     * every later instruction: all earlier work of the producer pipe is then complete for every
     * pipe (V -> S -> MTE3 is ordered). */
    auto drain = [&](uint8_t p) {
        if (p == P_NONE || p == P_S) return;
        for (uint8_t q = 0; q < P_COUNT; ++q) {
            if (c.ordered[p][q] < seq) c.ordered[p][q] = seq;
        }
    };
#endif
    for (size_t b = b0; b < b1; ++b) {
        BlockHazard& h = c.ubHazard[b];
#ifndef ASCEND_SIM_NO_AUTO_SYNC
        if (pipe == P_S) {
            if (h.wSeq != 0) drain(h.wPipe);
            if (write) {
                for (uint8_t p = 0; p < P_COUNT; ++p) {
                    if (h.rSeq[p] != 0) drain(p);
                }
            }
        }
#endif
        if (!ordered(c, r.qSync, h.wPipe, pipe, h.wSeq)) {
            failf("buffer written by ", pipe_name(h.wPipe), write ? " overwritten by " : " read by ", pipe_name(pipe),
                  " without synchronisation", where(h.wPipe));
        }
        if (write) {
            for (uint8_t p = 0; p < P_COUNT; ++p) {
                if (p != pipe && !ordered(c, r.qSync, p, pipe, h.rSeq[p])) {
                    failf("buffer read by ", pipe_name(p), " overwritten by ", pipe_name(pipe),
                          " without synchronisation", where(p));
                }
            }
            h.wPipe = pipe;
            h.wSeq = seq;
        } else {
            h.rSeq[pipe] = seq;
        }
    }
}

/* A fresh buffer has no history. */
inline void hazard_reset(CoreCtx& c, uint32_t addr, uint32_t bytes)
{
    if (c.ubHazard.empty()) return;
    const size_t b1 = std::min<size_t>((addr + bytes + kHazardBlock - 1) / kHazardBlock, c.ubHazard.size());
    for (size_t b = addr / kHazardBlock; b < b1; ++b) c.ubHazard[b] = BlockHazard();
}

/* `bytes` bytes from the start of tensor `t`. */
template <class T>
void touch(CoreCtx& c, const AscendC::LocalTensor<T>& t, uint64_t bytes, uint8_t pipe, bool write, uint64_t seq,
           const char* api, const char* role)
{
    touch(c, c.bufs[static_cast<size_t>(t.buf_)], t.addr_, bytes, pipe, write, seq, api, role);
}

/* `bytes` bytes at byte `offset` of tensor `t`. */
template <class T>
void touch_at(CoreCtx& c, const AscendC::LocalTensor<T>& t, uint64_t offset, uint64_t bytes, uint8_t pipe, bool write,
              uint64_t seq, const char* api, const char* role)
{
    touch(c, c.bufs[static_cast<size_t>(t.buf_)], static_cast<uint32_t>(t.addr_ + offset), bytes, pipe, write, seq, api,
          role);
}

/* Overlap rule (section 2.1, 11.8 item 8): dst and src either do not overlap or are exactly the
 * same elements (same start, same element size). */
inline void check_overlap(uint32_t dst, uint64_t dstBytes, uint32_t dstElem, uint32_t src, uint64_t srcBytes,
                          uint32_t srcElem, const char* api, const char* role)
{
    const uint64_t d0 = dst, d1 = dst + dstBytes, s0 = src, s1 = src + srcBytes;
    if (dstBytes == 0 || srcBytes == 0 || d1 <= s0 || s1 <= d0) return;
    if (d0 == s0 && dstElem == srcElem) return;
    failf(api, ": dst [", Hex{d0}, ", ", Hex{d1}, ") and ", role, " [", Hex{s0}, ", ", Hex{s1},
          ") partially overlap (only dst == src exactly is allowed)");
}

template <class D, class S>
void check_overlap(const AscendC::LocalTensor<D>& d, uint64_t dn, const AscendC::LocalTensor<S>& s, uint64_t sn,
                   const char* api, const char* role)
{
    if (d.buf_ != s.buf_) return; /* different buffers never overlap */
    check_overlap(d.addr_, dn * sizeof(D), sizeof(D), s.addr_, sn * sizeof(S), sizeof(S), api, role);
}

} // namespace ascend_sim

namespace AscendC {

template <class T>
ascend_sim::BufRec& LocalTensor<T>::rec(const char* api) const
{
    ascend_sim::CoreCtx& c = ascend_sim::core();
    return ascend_sim::live_rec(c, buf_, gen_, api, "the tensor");
}

template <class T>
T LocalTensor<T>::GetValue(const uint32_t index) const
{
    using namespace ascend_sim;
    CoreCtx& c = core();
    if (index >= size_) failf("LocalTensor::GetValue(", index, ") out of range: the tensor has ", size_, " elements");
    const uint8_t* p = ub_operand(c, *this, 0, "LocalTensor::GetValue", "the tensor", false, 1) + index * sizeof(T);
    touch_at(c, *this, index * sizeof(T), sizeof(T), P_S, false, ++c.seq, "LocalTensor::GetValue", "the tensor");
    return ld<T>(p);
}

template <class T>
void LocalTensor<T>::SetValue(const uint32_t index, const T value) const
{
    using namespace ascend_sim;
    CoreCtx& c = core();
    if (index >= size_) failf("LocalTensor::SetValue(", index, ") out of range: the tensor has ", size_, " elements");
    uint8_t* p = ub_operand(c, *this, 0, "LocalTensor::SetValue", "the tensor", true, 1) + index * sizeof(T);
    touch_at(c, *this, index * sizeof(T), sizeof(T), P_S, true, ++c.seq, "LocalTensor::SetValue", "the tensor");
    st<T>(p, value);
}

} // namespace AscendC

#endif // ASCEND_SIM_KERNEL_TENSOR_H
