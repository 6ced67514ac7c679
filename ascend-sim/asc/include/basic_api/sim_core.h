/*
 * ascend-sim: the per-core state shared by the kernel-side headers and libascendcl.so, and the
 * functions the library exports to the headers (launch machinery, inter-core sync, errors,
 * device-memory registry).
 *
 * Execution model (sim.md "Execution model", docs/ascend-c.md 1.1/1.2/11.1): every logical core
 * of a launch is one std::thread with a CoreCtx; all cores of a launch run concurrently.
 */
#ifndef ASCEND_SIM_SIM_CORE_H
#define ASCEND_SIM_SIM_CORE_H

#include "sim_types.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <functional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#define ASCEND_SIM_EXPORT __attribute__((visibility("default")))

namespace ascend_sim {

/* ---- Pipes, as indices of the hazard tracker (section 1.1). ---- */
enum PipeIdx : uint8_t { P_S = 0, P_V, P_M, P_MTE1, P_MTE2, P_MTE3, P_FIX, P_COUNT, P_NONE = 0xff };

inline const char* pipe_name(uint8_t p)
{
    static const char* const names[] = {"S", "V", "M", "MTE1", "MTE2", "MTE3", "FIX"};
    return p < P_COUNT ? names[p] : "none";
}

inline uint8_t pipe_index(pipe_t p)
{
    switch (p) {
        case PIPE_S: return P_S;
        case PIPE_V: return P_V;
        case PIPE_M: return P_M;
        case PIPE_MTE1: return P_MTE1;
        case PIPE_MTE2: return P_MTE2;
        case PIPE_MTE3: return P_MTE3;
        case PIPE_FIX: return P_FIX;
        default: return P_NONE;
    }
}

/* HardEvent -> (source pipe, destination pipe), in the order of AscendC::HardEvent. */
struct EventPipes {
    uint8_t src, dst;
    const char* name;
};
constexpr int kHardEvents = static_cast<int>(AscendC::HardEvent::MAX);
inline const EventPipes& event_pipes(int ev)
{
    static const EventPipes table[kHardEvents] = {
        {P_MTE2, P_MTE1, "MTE2_MTE1"}, {P_MTE1, P_MTE2, "MTE1_MTE2"}, {P_MTE1, P_M, "MTE1_M"},
        {P_M, P_MTE1, "M_MTE1"},       {P_MTE2, P_V, "MTE2_V"},       {P_V, P_MTE2, "V_MTE2"},
        {P_MTE3, P_V, "MTE3_V"},       {P_V, P_MTE3, "V_MTE3"},       {P_M, P_V, "M_V"},
        {P_V, P_M, "V_M"},             {P_V, P_V, "V_V"},             {P_MTE3, P_MTE1, "MTE3_MTE1"},
        {P_MTE1, P_MTE3, "MTE1_MTE3"}, {P_MTE1, P_V, "MTE1_V"},       {P_MTE2, P_M, "MTE2_M"},
        {P_M, P_MTE2, "M_MTE2"},       {P_V, P_MTE1, "V_MTE1"},       {P_M, P_FIX, "M_FIX"},
        {P_FIX, P_M, "FIX_M"},         {P_MTE3, P_MTE2, "MTE3_MTE2"}, {P_MTE2, P_MTE3, "MTE2_MTE3"},
        {P_S, P_V, "S_V"},             {P_V, P_S, "V_S"},             {P_S, P_MTE2, "S_MTE2"},
        {P_MTE2, P_S, "MTE2_S"},       {P_S, P_MTE3, "S_MTE3"},       {P_MTE3, P_S, "MTE3_S"},
        {P_MTE2, P_FIX, "MTE2_FIX"},   {P_FIX, P_MTE2, "FIX_MTE2"},   {P_FIX, P_S, "FIX_S"},
        {P_M, P_S, "M_S"},             {P_FIX, P_MTE3, "FIX_MTE3"},   {P_MTE1, P_FIX, "MTE1_FIX"},
        {P_FIX, P_MTE1, "FIX_MTE1"},   {P_FIX, P_FIX, "FIX_FIX"},
    };
    return table[ev];
}

inline const char* ktype_name(int t)
{
    static const char* const names[] = {"KERNEL_TYPE_AIV_ONLY",    "KERNEL_TYPE_AIC_ONLY",    "KERNEL_TYPE_MIX_AIV_1_0",
                                        "KERNEL_TYPE_MIX_AIC_1_0", "KERNEL_TYPE_MIX_AIC_1_1", "KERNEL_TYPE_MIX_AIC_1_2"};
    return t >= 0 && t < 6 ? names[t] : "an unsupported kernel type";
}

/* ---- Per-core physical memories (section 8, sim.md "Per-core memories"). ---- */
enum class Mem : uint8_t { UB = 0, L1, L0A, L0B, L0C, BT, COUNT, NONE = 0xff };
constexpr int kMems = static_cast<int>(Mem::COUNT);
/* Physical bytes of each memory. */
constexpr uint32_t kMemBytes[kMems] = {196352u, 524032u, 65536u, 65536u, 131072u, 1024u};
/* Usable limit for InitBuffer: UB keeps the 8 KB Ascend C reserve (188160 B) unless the code is
 * compiled with --cce-disable-asc-reserved-ubuf (the wrapper then defines the macro below). */
#ifdef ASCEND_SIM_NO_RESERVED_UBUF
constexpr uint32_t kUbUsable = 196352u;
#else
constexpr uint32_t kUbUsable = 188160u;
#endif
inline uint32_t mem_limit(Mem m) { return m == Mem::UB ? kUbUsable : kMemBytes[static_cast<int>(m)]; }
inline const char* mem_name(Mem m)
{
    static const char* const names[] = {"UB", "L1", "L0A", "L0B", "L0C", "BT"};
    return static_cast<int>(m) < kMems ? names[static_cast<int>(m)] : "GM";
}
constexpr uint8_t kPoison = 0xff; /* fresh buffers read as NaN floats / halves */

/* ---- Buffer records: one per TQue block or TBuf (section 1.4, 11.8 items 5-6). ---- */
enum class BufState : uint8_t { Free, Allocated, Enqueued, Dequeued, Scratch, Dead };

inline const char* buf_state_name(BufState s)
{
    switch (s) {
        case BufState::Free: return "free";
        case BufState::Allocated: return "allocated";
        case BufState::Enqueued: return "enqueued";
        case BufState::Dequeued: return "dequeued";
        case BufState::Scratch: return "TBuf";
        default: return "destroyed";
    }
}

struct BufRec {
    Mem mem = Mem::UB;
    BufState state = BufState::Dead;
    uint8_t pos = 0;        /* AscendC::TPosition */
    int32_t queue = -1;     /* owning queue id, -1 for a TBuf */
    uint32_t base = 0;      /* byte address in its memory */
    uint32_t len = 0;       /* bytes */
    uint32_t gen = 1;       /* bumped by FreeTensor / pipe teardown: stale tensors are detected */
    uint64_t qSync = 0;     /* last queue operation on it (EnQue/DeQue/AllocTensor/FreeTensor) */
};

/* Pipe-hazard state of one 32-byte UB block (section 11.8 item 6). */
constexpr uint32_t kHazardBlock = 32;
struct BlockHazard {
    uint8_t wPipe = P_NONE;      /* pipe of the last writer */
    uint64_t wSeq = 0;           /* op sequence number of the last write */
    uint64_t rSeq[P_COUNT] = {}; /* last read per pipe */
};

struct LaunchCtx; /* library-internal */

struct CoreCtx {
    LaunchCtx* launch = nullptr;
    const std::atomic<bool>* aborted = nullptr;
    const char* kernel = "";
    bool aic = false;
    int ktype = 0;  /* KernelMetaType of the launch */
    int group = 0;  /* AI-core group (mix) or block */
    int64_t blockIdx = 0, blockNum = 1, subBlockIdx = 0, subBlockNum = 1, taskRatio = 1;

    std::vector<uint8_t> mem[kMems]; /* allocated on first InitBuffer of that memory */
    std::vector<BufRec> bufs;        /* stable indices for the whole launch */
    std::vector<BlockHazard> ubHazard; /* one per 32-byte block of UB */
    void* livePipe = nullptr;        /* the one TPipe of this core (section 1.4) */
    int32_t nextQueueId = 0;

    /* hazard tracker clocks */
    uint64_t seq = 0;
    uint64_t ordered[P_COUNT][P_COUNT] = {}; /* writes/reads of pipe i up to seq are ordered before pipe j */
    uint64_t barrierAll = 0;                 /* last PipeBarrier<PIPE_ALL> */

    /* SetFlag/WaitFlag state per (HardEvent, id) (section 1.7, 11.2) */
    struct Flag {
        bool set = false;
        uint64_t seq = 0;
    };
    Flag flags[kHardEvents][8];
    uint8_t eventIdsInUse[kHardEvents] = {}; /* AllocEventID bitmasks */

    uint8_t* sysWorkspace = nullptr; /* what the deprecated SetSysWorkspace stored (nothing reads it on 2201) */
    uint8_t* kfcWorkspace = nullptr; /* the kfc workspace register: the launch's __kfc_workspace__ argument */
    int atomicType = 0; /* SetAtomicAdd<T>: 0 = off, else a type code */

    /* Matmul client state (section 3.1) */
    int mmObjects = 0;      /* objects registered by REGIST_MATMUL_OBJ on this core */
    bool mmQuit = false;    /* the REGIST_MATMUL_OBJ scope of this AIV has ended */
    const void* mmHolding = nullptr; /* the object whose computation holds the cube's L1/L0C until its End() */
};

/* Errors: a violated invariant throws KernelError out of the kernel thread; Abort unwinds the
 * other threads of the launch after the first error (section "Errors" of sim.md). */
struct KernelError : std::runtime_error {
    using std::runtime_error::runtime_error;
};
struct Abort {};

/* ---- Exported by libascendcl.so ---- */
ASCEND_SIM_EXPORT CoreCtx* this_core() noexcept;
/* Throws KernelError "ascend-sim: <kernel> block <i> (<AIV|AIC>): <what>". */
[[noreturn]] ASCEND_SIM_EXPORT void fail(const std::string& what);
[[noreturn]] ASCEND_SIM_EXPORT void throw_abort();
ASCEND_SIM_EXPORT void warn(const std::string& what) noexcept;
/* Is [p, p + bytes) inside one aclrtMalloc allocation? Reports that allocation's bounds. */
ASCEND_SIM_EXPORT bool device_range(const void* p, uint64_t bytes, uintptr_t* begin, uintptr_t* end) noexcept;
/* Inter-core synchronisation (section 1.7). */
ASCEND_SIM_EXPORT void sync_all(bool aivOnly);
ASCEND_SIM_EXPORT void cross_core_set(int mode, int pipe, int flagId);
ASCEND_SIM_EXPORT void cross_core_wait(int mode, int pipe, int flagId);
/* Matmul MIX mode: the AIV forwards `work` to its group's AIC and waits for the reply. */
ASCEND_SIM_EXPORT void matmul_call(const char* what, const std::function<void()>& work);
/* The AIC serves its AIVs until each has left its REGIST_MATMUL_OBJ scope or the kernel. */
ASCEND_SIM_EXPORT void matmul_serve();
ASCEND_SIM_EXPORT void matmul_client_quit() noexcept;
/* Serialises atomic accumulation into GM (SetAtomicAdd, IterateAll enAtomic). */
ASCEND_SIM_EXPORT void gm_atomic_lock() noexcept;
ASCEND_SIM_EXPORT void gm_atomic_unlock() noexcept;
/* Runs one launch synchronously; errors are recorded in the stream. */
/* `kfcWorkspace`: the argument of the kernel's `__kfc_workspace__` parameter (null when it has
 * none), loaded into every core's kfc workspace register. */
ASCEND_SIM_EXPORT void run_kernel(const char* name, int ktype, uint32_t numBlocks, void* stream,
                                  uint8_t* kfcWorkspace, const std::function<void()>& body);

/* ---- Helpers for the kernel-side headers ---- */

/* The calling core; an API called outside a kernel launch is an error. After the first error of
 * the launch every API call unwinds (Abort). */
inline CoreCtx& core()
{
    CoreCtx* c = this_core();
    if (c == nullptr) {
        throw KernelError("ascend-sim: an Ascend C kernel API was called outside a kernel launch");
    }
    if (c->aborted->load(std::memory_order_relaxed)) throw_abort();
    return *c;
}

inline bool is_aiv()
{
    CoreCtx* c = this_core();
    return c != nullptr && !c->aic;
}
inline bool is_aic()
{
    CoreCtx* c = this_core();
    return c != nullptr && c->aic;
}

/* Message building: msg("a", 1, "b") -> "a1b". */
template <class... A>
std::string msg(const A&... parts)
{
    std::ostringstream os;
    (os << ... << parts);
    return os.str();
}
struct Hex {
    uint64_t v;
};
inline std::ostream& operator<<(std::ostream& os, Hex h)
{
    char buf[32];
    std::snprintf(buf, sizeof buf, "0x%llx", static_cast<unsigned long long>(h.v));
    return os << buf;
}

template <class... A>
[[noreturn]] void failf(const A&... parts)
{
    fail(msg(parts...));
}

/* Element loads/stores through memcpy: memories are byte arrays (no aliasing or alignment UB). */
template <class T>
inline T ld(const void* p)
{
    T v;
    std::memcpy(&v, p, sizeof(T));
    return v;
}
template <class T>
inline void st(void* p, T v)
{
    std::memcpy(p, &v, sizeof(T));
}

template <class T>
constexpr const char* type_name()
{
    if constexpr (std::is_same_v<T, float>) return "float";
    else if constexpr (std::is_same_v<T, half>) return "half";
    else if constexpr (std::is_same_v<T, bfloat16_t>) return "bfloat16_t";
    else if constexpr (std::is_same_v<T, double>) return "double";
    else if constexpr (std::is_same_v<T, int8_t>) return "int8_t";
    else if constexpr (std::is_same_v<T, uint8_t>) return "uint8_t";
    else if constexpr (std::is_same_v<T, int16_t>) return "int16_t";
    else if constexpr (std::is_same_v<T, uint16_t>) return "uint16_t";
    else if constexpr (std::is_same_v<T, int32_t>) return "int32_t";
    else if constexpr (std::is_same_v<T, uint32_t>) return "uint32_t";
    else if constexpr (std::is_same_v<T, int64_t>) return "int64_t";
    else if constexpr (std::is_same_v<T, uint64_t>) return "uint64_t";
    else if constexpr (std::is_same_v<T, bool>) return "bool";
    else return "T";
}

/* A small numeric type code (SetAtomicAdd<T> bookkeeping). */
template <class T>
constexpr int type_code()
{
    if constexpr (std::is_same_v<T, float>) return 1;
    else if constexpr (std::is_same_v<T, half>) return 2;
    else if constexpr (std::is_same_v<T, bfloat16_t>) return 3;
    else if constexpr (std::is_same_v<T, int32_t>) return 4;
    else if constexpr (std::is_same_v<T, int16_t>) return 5;
    else if constexpr (std::is_same_v<T, int8_t>) return 6;
    else return 7;
}

/* Value conversions used by the vector unit emulation: everything computes in float/double and
 * is rounded to the element type at the end of each instruction. */
template <class T>
inline double to_num(T v)
{
    if constexpr (std::is_same_v<T, half> || std::is_same_v<T, bfloat16_t>) return static_cast<double>(static_cast<float>(v));
    else return static_cast<double>(v);
}
template <class T>
inline T from_num(double v)
{
    if constexpr (std::is_same_v<T, half> || std::is_same_v<T, bfloat16_t>) {
        return T(static_cast<float>(v));
    } else if constexpr (std::is_floating_point_v<T>) {
        return static_cast<T>(v);
    } else {
        /* integer results saturate (no UB on overflow) */
        if (std::isnan(v)) return T(0);
        const double lo = static_cast<double>(std::numeric_limits<T>::min());
        const double hi = static_cast<double>(std::numeric_limits<T>::max());
        return static_cast<T>(v < lo ? lo : (v > hi ? hi : v));
    }
}

} // namespace ascend_sim

#endif // ASCEND_SIM_SIM_CORE_H
