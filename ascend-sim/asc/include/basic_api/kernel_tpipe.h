/*
 * ascend-sim: TPipe / TQue / TQueBind / TBuf (docs/ascend-c.md 1.4, 11.3; invariants 11.8
 * items 1 and 5).
 *
 * TPipe is a bump allocator per physical memory of its core (32-byte aligned addresses, 512 B
 * for L0A/L0B, 64 B for L0C/BT). Each queue block and each TBuf is a buffer record of the core;
 * queue blocks follow the state machine Free -> Allocated -> Enqueued -> Dequeued -> Free.
 */
#ifndef ASCEND_SIM_KERNEL_TPIPE_H
#define ASCEND_SIM_KERNEL_TPIPE_H

#include "kernel_tensor.h"

#include <deque>

namespace ascend_sim {

constexpr int kMaxBuffers = 64;          /* QBUF_MAX_LEN (section 1.4) */
constexpr int kMaxAllocatedPerPos = 8;   /* QUE_MAX_EVENT on A2 (section 1.4) */
constexpr int kPositions = static_cast<int>(AscendC::TPosition::MAX);

inline Mem mem_of(AscendC::TPosition p)
{
    using AscendC::TPosition;
    switch (p) {
        case TPosition::VECIN:
        case TPosition::VECOUT:
        case TPosition::VECCALC: return Mem::UB;
        case TPosition::A1:
        case TPosition::B1:
        case TPosition::C1:
        case TPosition::TSCM: return Mem::L1;
        case TPosition::A2: return Mem::L0A;
        case TPosition::B2: return Mem::L0B;
        case TPosition::CO1: return Mem::L0C;
        case TPosition::C2: return Mem::BT;
        default: return Mem::NONE;
    }
}

inline const char* position_name(uint8_t p)
{
    static const char* const names[] = {"GM",  "A1",    "A2",     "B1",      "B2",  "C1",   "C2",
                                        "CO1", "CO2",   "VECIN",  "VECOUT",  "VECCALC", "SPM", "TSCM",
                                        "C2PIPE2GM", "C2PIPE2LOCAL"};
    return p < sizeof(names) / sizeof(names[0]) ? names[p] : "?";
}

inline uint32_t mem_align(Mem m)
{
    switch (m) {
        case Mem::L0A:
        case Mem::L0B: return 512;
        case Mem::L0C:
        case Mem::BT: return 64;
        default: return 32;
    }
}

/* Non-template part of TQue / TQueBind. */
class QueBase {
public:
    QueBase(AscendC::TPosition pos, int32_t depth) : pos_(pos), depth_(depth) {}
    QueBase(const QueBase&) = delete;
    QueBase& operator=(const QueBase&) = delete;

    bool HasIdleBuffer() const
    {
        CoreCtx& c = core();
        if (!bound(c)) return false;
        for (int32_t b : bufs_) {
            if (c.bufs[static_cast<size_t>(b)].state == BufState::Free) return true;
        }
        return false;
    }
    int32_t GetTensorCountInQue() const { return static_cast<int32_t>(fifo_.size()); }
    bool HasTensorInQue() const { return !fifo_.empty(); }
    bool VacantInQue() const { return depth_ <= 0 || static_cast<int32_t>(fifo_.size()) < depth_; }

    /* ---- sim internals ---- */
    bool bound(const CoreCtx& c) const
    {
        return !bufs_.empty() && c.bufs[static_cast<size_t>(bufs_[0])].state != BufState::Dead;
    }
    void need_bound(CoreCtx& c, const char* api) const
    {
        if (bufs_.empty()) failf(api, ": the queue has no buffers (call TPipe::InitBuffer first)");
        if (!bound(c)) failf(api, ": the queue's TPipe was reset or destroyed");
    }

    /* Allocated + Enqueued + Dequeued blocks per TPosition, shared by the queues of one TPipe. */
    int* allocatedPerPos_ = nullptr;
    AscendC::TPosition pos_;
    int32_t depth_;
    int32_t id_ = -1;
    std::vector<int32_t> bufs_;
    std::deque<int32_t> fifo_;
    size_t next_ = 0;
    uint32_t len_ = 0;

    BufRec& alloc_block(CoreCtx& c, int32_t& index)
    {
        need_bound(c, "AllocTensor");
        const size_t n = bufs_.size();
        for (size_t k = 0; k < n; ++k) {
            const size_t i = (next_ + k) % n;
            BufRec& r = c.bufs[static_cast<size_t>(bufs_[i])];
            if (r.state != BufState::Free) continue;
            int& count = allocatedPerPos_[static_cast<int>(pos_)];
            if (count + 1 > kMaxAllocatedPerPos) {
                failf("AllocTensor: more than ", kMaxAllocatedPerPos, " buffers of position ",
                      position_name(static_cast<uint8_t>(pos_)),
                      " allocated at once (QUE_MAX_EVENT on A2; hangs on hardware): use one queue with a larger len "
                      "and slice it");
            }
            ++count;
            next_ = (i + 1) % n;
            r.state = BufState::Allocated;
            r.qSync = ++c.seq;
            index = bufs_[i];
            return r;
        }
        failf("AllocTensor: no free buffer in the ", position_name(static_cast<uint8_t>(pos_)), " queue (all ", n,
              " buffers are allocated or enqueued; this deadlocks on hardware): FreeTensor one first");
    }

    void enque(CoreCtx& c, int32_t buf, uint32_t gen)
    {
        need_bound(c, "EnQue");
        BufRec& r = live_rec(c, buf, gen, "EnQue", "the tensor");
        if (r.queue != id_) {
            failf("EnQue: the tensor does not belong to this queue (",
                  r.queue < 0 ? "a TBuf tensor cannot be enqueued" : "it was allocated from another queue", ")");
        }
        if (r.state == BufState::Enqueued) failf("EnQue: the tensor is already enqueued");
        if (depth_ > 0 && static_cast<int32_t>(fifo_.size()) >= depth_) {
            failf("EnQue beyond the queue depth ", depth_, " (", fifo_.size(),
                  " tensors already enqueued without DeQue)");
        }
        fifo_.push_back(buf);
        r.state = BufState::Enqueued;
        r.qSync = ++c.seq;
    }

    int32_t deque(CoreCtx& c)
    {
        need_bound(c, "DeQue");
        if (fifo_.empty()) failf("DeQue on an empty queue (no EnQue before it; hangs on hardware)");
        const int32_t b = fifo_.front();
        fifo_.pop_front();
        BufRec& r = c.bufs[static_cast<size_t>(b)];
        r.state = BufState::Dequeued;
        r.qSync = ++c.seq;
        return b;
    }

    void free_block(CoreCtx& c, int32_t buf, uint32_t gen)
    {
        need_bound(c, "FreeTensor");
        if (buf < 0 || static_cast<size_t>(buf) >= c.bufs.size()) failf("FreeTensor of an uninitialised LocalTensor");
        BufRec& r = c.bufs[static_cast<size_t>(buf)];
        if (r.queue != id_) {
            failf("FreeTensor of a tensor that does not belong to this queue (",
                  r.queue < 0 ? "a TBuf tensor" : "it was allocated from another queue", ")");
        }
        if (r.gen != gen || r.state == BufState::Free) failf("FreeTensor of a tensor that is already free");
        if (r.state == BufState::Enqueued) failf("FreeTensor of a tensor that is still enqueued (DeQue it first)");
        r.state = BufState::Free;
        ++r.gen;
        r.qSync = ++c.seq;
        --allocatedPerPos_[static_cast<int>(pos_)];
    }

    template <class T>
    AscendC::LocalTensor<T> tensor_of(CoreCtx& c, int32_t b) const
    {
        const BufRec& r = c.bufs[static_cast<size_t>(b)];
        AscendC::LocalTensor<T> t;
        t.buf_ = b;
        t.gen_ = r.gen;
        t.addr_ = r.base;
        t.size_ = static_cast<uint32_t>(r.len / sizeof(T));
        return t;
    }
};

} // namespace ascend_sim

namespace AscendC {

class TPipe;

/* TQueBind<src, dst, depth>: a queue between two positions; memory follows `src`. */
template <TPosition src, TPosition dst, int32_t depth, auto mask = 0>
class TQueBind : public ascend_sim::QueBase {
public:
    TQueBind() : QueBase(src, depth) {}

    template <class T>
    LocalTensor<T> AllocTensor()
    {
        ascend_sim::CoreCtx& c = ascend_sim::core();
        int32_t b = -1;
        alloc_block(c, b);
        return tensor_of<T>(c, b);
    }
    template <class T>
    void AllocTensor(LocalTensor<T>& t)
    {
        t = AllocTensor<T>();
    }
    template <class T>
    bool EnQue(const LocalTensor<T>& t)
    {
        enque(ascend_sim::core(), t.buf_, t.gen_);
        return true;
    }
    template <TPosition srcPos, TPosition dstPos, class T>
    bool EnQue(const LocalTensor<T>& t)
    {
        return EnQue(t);
    }
    template <class T>
    LocalTensor<T> DeQue()
    {
        ascend_sim::CoreCtx& c = ascend_sim::core();
        return tensor_of<T>(c, deque(c));
    }
    template <class T>
    void DeQue(LocalTensor<T>& t)
    {
        t = DeQue<T>();
    }
    template <TPosition srcPos, TPosition dstPos, class T>
    LocalTensor<T> DeQue()
    {
        return DeQue<T>();
    }
    template <class T>
    void FreeTensor(LocalTensor<T>& t)
    {
        free_block(ascend_sim::core(), t.buf_, t.gen_);
    }
};

/* TQue<pos, depth>: depth = max consecutive EnQue without DeQue (section 1.4). */
template <TPosition pos, int32_t depth, auto mask = 0>
class TQue : public TQueBind<pos, pos, depth, mask> {};

/* TBuf<pos>: scratch memory; tensors from Get are never freed and cannot be queued. */
template <TPosition pos = TPosition::VECCALC>
class TBuf {
public:
    TBuf() = default;
    TBuf(const TBuf&) = delete;
    TBuf& operator=(const TBuf&) = delete;

    template <class T>
    LocalTensor<T> Get()
    {
        ascend_sim::CoreCtx& c = ascend_sim::core();
        const ascend_sim::BufRec& r = rec(c, "TBuf::Get");
        return make<T>(r, 0, static_cast<uint32_t>(r.len / sizeof(T)));
    }
    template <class T>
    LocalTensor<T> Get(uint32_t count)
    {
        ascend_sim::CoreCtx& c = ascend_sim::core();
        const ascend_sim::BufRec& r = rec(c, "TBuf::Get");
        if (static_cast<uint64_t>(count) * sizeof(T) > r.len) {
            ascend_sim::failf("TBuf::Get<", ascend_sim::type_name<T>(), ">(", count, "): ",
                              static_cast<uint64_t>(count) * sizeof(T), " bytes exceed the buffer's ", r.len, " bytes");
        }
        return make<T>(r, 0, count);
    }
    template <class T>
    LocalTensor<T> GetWithOffset(uint32_t size, uint32_t bufOffset)
    {
        ascend_sim::CoreCtx& c = ascend_sim::core();
        const ascend_sim::BufRec& r = rec(c, "TBuf::GetWithOffset");
        if (static_cast<uint64_t>(bufOffset) + static_cast<uint64_t>(size) * sizeof(T) > r.len) {
            ascend_sim::failf("TBuf::GetWithOffset<", ascend_sim::type_name<T>(), ">(", size, ", ", bufOffset,
                              "): exceeds the buffer's ", r.len, " bytes");
        }
        return make<T>(r, bufOffset, size);
    }

    /* ---- sim internals ---- */
    int32_t rec_ = -1;

private:
    const ascend_sim::BufRec& rec(ascend_sim::CoreCtx& c, const char* api) const
    {
        if (rec_ < 0) ascend_sim::failf(api, ": the TBuf has no memory (call TPipe::InitBuffer first)");
        const ascend_sim::BufRec& r = c.bufs[static_cast<size_t>(rec_)];
        if (r.state == ascend_sim::BufState::Dead) ascend_sim::failf(api, ": the TBuf's TPipe was reset or destroyed");
        return r;
    }
    template <class T>
    LocalTensor<T> make(const ascend_sim::BufRec& r, uint32_t off, uint32_t count) const
    {
        LocalTensor<T> t;
        t.buf_ = rec_;
        t.gen_ = r.gen;
        t.addr_ = r.base + off;
        t.size_ = count;
        return t;
    }
};

/* TPipe: one live per core; owns the on-chip memory of its queues and buffers. */
class TPipe {
public:
    TPipe() : core_(&ascend_sim::core())
    {
        if (core_->livePipe != nullptr) {
            ascend_sim::failf("TPipe has already been constructed on this core (one TPipe per kernel, section 1.4); "
                              "Destroy() the first one before creating another");
        }
        core_->livePipe = this;
    }
    TPipe(const TPipe&) = delete;
    TPipe& operator=(const TPipe&) = delete;
    ~TPipe() { teardown(); }

    /* `num` blocks of `len` bytes (len rounded up to 32 B). */
    template <class Q>
    bool InitBuffer(Q& que, uint8_t num, uint32_t len)
    {
        ascend_sim::CoreCtx& c = live("InitBuffer");
        ascend_sim::QueBase& q = que;
        if (!q.bufs_.empty() && q.bound(c)) ascend_sim::failf("InitBuffer called twice on the same queue");
        if (num == 0 || len == 0) ascend_sim::failf("InitBuffer: num (", int(num), ") and len (", len, ") must be > 0");
        q.bufs_.clear();
        q.fifo_.clear();
        q.next_ = 0;
        q.id_ = c.nextQueueId++;
        q.allocatedPerPos_ = allocatedPerPos_;
        const uint32_t lenR = round32(len);
        q.len_ = lenR;
        reserve(c, q.pos_, num, lenR);
        for (int i = 0; i < num; ++i) {
            q.bufs_.push_back(add_record(c, q.pos_, lenR, ascend_sim::BufState::Free, q.id_));
        }
        return true;
    }

    template <TPosition pos>
    bool InitBuffer(TBuf<pos>& buf, uint32_t len)
    {
        ascend_sim::CoreCtx& c = live("InitBuffer");
        if (buf.rec_ >= 0 && c.bufs[static_cast<size_t>(buf.rec_)].state != ascend_sim::BufState::Dead) {
            ascend_sim::failf("InitBuffer called twice on the same TBuf");
        }
        if (len == 0) ascend_sim::failf("InitBuffer: len must be > 0");
        const uint32_t lenR = round32(len);
        reserve(c, pos, 1, lenR);
        buf.rec_ = add_record(c, pos, lenR, ascend_sim::BufState::Scratch, -1);
        return true;
    }

    /* Frees every buffer of this pipe (their tensors become stale). */
    void Reset()
    {
        live("Reset");
        release();
    }
    void Destroy()
    {
        live("Destroy");
        teardown();
        destroyed_ = true;
    }

    template <HardEvent e>
    TEventID AllocEventID()
    {
        ascend_sim::CoreCtx& c = live("AllocEventID");
        uint8_t& used = c.eventIdsInUse[static_cast<int>(e)];
        for (int id = 0; id < 8; ++id) {
            if (!(used & (1u << id))) {
                used = static_cast<uint8_t>(used | (1u << id));
                return static_cast<TEventID>(id);
            }
        }
        ascend_sim::failf("AllocEventID<", ascend_sim::event_pipes(static_cast<int>(e)).name,
                          ">: all 8 event ids are allocated");
    }
    template <HardEvent e>
    void ReleaseEventID(TEventID id)
    {
        ascend_sim::CoreCtx& c = live("ReleaseEventID");
        if (id < 0 || id > 7) ascend_sim::failf("ReleaseEventID: event id ", int(id), " is outside 0..7");
        c.eventIdsInUse[static_cast<int>(e)] = static_cast<uint8_t>(c.eventIdsInUse[static_cast<int>(e)] & ~(1u << id));
    }
    template <HardEvent e>
    TEventID FetchEventID()
    {
        return FetchEventID(e);
    }
    TEventID FetchEventID(HardEvent e)
    {
        ascend_sim::CoreCtx& c = live("FetchEventID");
        const uint8_t used = c.eventIdsInUse[static_cast<int>(e)];
        for (int id = 0; id < 8; ++id) {
            if (!(used & (1u << id))) return static_cast<TEventID>(id);
        }
        ascend_sim::failf("FetchEventID: all 8 event ids are allocated");
    }

    /* ---- sim internals ---- */
    int initCount_ = 0; /* InitBuffer calls (REGIST_MATMUL_OBJ must come first in split mode) */

    /* Reserve on-chip memory for a library object (Matmul L1 buffers on the AIC). */
    void reserve_bytes(ascend_sim::Mem m, uint32_t bytes, const char* what)
    {
        ascend_sim::CoreCtx& c = live(what);
        const uint32_t limit = ascend_sim::mem_limit(m);
        if (static_cast<uint64_t>(used_[static_cast<int>(m)]) + bytes > limit) {
            ascend_sim::failf(what, ": ", ascend_sim::mem_name(m), " over capacity: ", used_[static_cast<int>(m)],
                              " + ", bytes, " > ", limit);
        }
        used_[static_cast<int>(m)] += bytes;
        (void)c;
    }
    uint32_t used(ascend_sim::Mem m) const { return used_[static_cast<int>(m)]; }

private:
    static uint32_t round32(uint32_t len) { return static_cast<uint32_t>((static_cast<uint64_t>(len) + 31u) / 32u * 32u); }

    ascend_sim::CoreCtx& live(const char* api)
    {
        ascend_sim::CoreCtx& c = ascend_sim::core();
        if (destroyed_) ascend_sim::failf("TPipe::", api, " after TPipe::Destroy()");
        return c;
    }

    /* Capacity and count checks (section 11.8 items 1 and 5). */
    void reserve(ascend_sim::CoreCtx& c, TPosition pos, uint32_t num, uint32_t lenR)
    {
        using namespace ascend_sim;
        (void)c;
        const Mem m = mem_of(pos);
        if (m == Mem::NONE) {
            failf("InitBuffer: position ", position_name(static_cast<uint8_t>(pos)), " has no on-chip memory");
        }
        if (nBufs_ + static_cast<int>(num) > kMaxBuffers) {
            failf("InitBuffer: more than ", kMaxBuffers, " buffers in one TPipe (QBUF_MAX_LEN): ", nBufs_, " + ", num,
                  " > ", kMaxBuffers);
        }
        const uint32_t a = mem_align(m);
        const uint64_t start = (static_cast<uint64_t>(used_[static_cast<int>(m)]) + a - 1) / a * a;
        const uint64_t need = static_cast<uint64_t>(num - 1) * ((lenR + a - 1) / a * a) + lenR;
        const uint32_t limit = mem_limit(m);
        if (start + need > limit) {
            failf(mem_name(m), " over capacity: ", start, " + ", need, " > ", limit, " (InitBuffer of ", num, " x ",
                  lenR, " bytes at position ", position_name(static_cast<uint8_t>(pos)), ")");
        }
        used_[static_cast<int>(m)] = static_cast<uint32_t>(start);
        nBufs_ += static_cast<int>(num);
        ++initCount_;
    }

    int32_t add_record(ascend_sim::CoreCtx& c, TPosition pos, uint32_t lenR, ascend_sim::BufState s, int32_t queue)
    {
        using namespace ascend_sim;
        const Mem m = mem_of(pos);
        if (m == Mem::NONE) failf("InitBuffer: position ", position_name(static_cast<uint8_t>(pos)), " has no on-chip memory");
        std::vector<uint8_t>& mem = c.mem[static_cast<int>(m)];
        if (mem.empty()) mem.assign(kMemBytes[static_cast<int>(m)], kPoison);
        const uint32_t a = mem_align(m);
        const uint32_t base = (used_[static_cast<int>(m)] + a - 1) / a * a;
        BufRec r;
        r.mem = m;
        r.state = s;
        r.pos = static_cast<uint8_t>(pos);
        r.queue = queue;
        r.base = base;
        r.len = lenR;
        std::memset(mem.data() + base, kPoison, lenR); /* fresh buffers read as NaN */
        if (m == Mem::UB) hazard_reset(c, base, lenR);
        used_[static_cast<int>(m)] = base + lenR;
        c.bufs.push_back(r);
        records_.push_back(static_cast<int32_t>(c.bufs.size() - 1));
        return records_.back();
    }

    /* Marks every record dead (stale tensors are detected) and frees the memory. */
    void release() noexcept
    {
        ascend_sim::CoreCtx* c = core_;
        for (int32_t i : records_) {
            ascend_sim::BufRec& r = c->bufs[static_cast<size_t>(i)];
            r.state = ascend_sim::BufState::Dead;
            ++r.gen;
        }
        records_.clear();
        for (uint32_t& u : used_) u = 0;
        for (int& n : allocatedPerPos_) n = 0;
        nBufs_ = 0;
    }

    void teardown() noexcept
    {
        if (destroyed_) return;
        release();
        if (core_->livePipe == this) core_->livePipe = nullptr;
    }

    ascend_sim::CoreCtx* core_;
    uint32_t used_[ascend_sim::kMems] = {};
    int allocatedPerPos_[ascend_sim::kPositions] = {};
    int nBufs_ = 0;
    bool destroyed_ = false;
    std::vector<int32_t> records_;
};

} // namespace AscendC

#endif // ASCEND_SIM_KERNEL_TPIPE_H
