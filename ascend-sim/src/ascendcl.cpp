/*
 * ascend-sim: libascendcl.so — the AscendCL runtime subset (docs/ascend-c.md section 6) and the
 * kernel-launch machinery of the emulator (sim.md "Execution model").
 *
 *  - Device memory is host memory; aclrtMalloc registers [p, p + size) so kernels and memcpys can
 *    check that device pointers really are device pointers.
 *  - A launch runs synchronously: one std::thread per logical core (AIV/AIC per kernel type,
 *    section 1.2), all concurrent, so SyncAll and cross-core flags behave like hardware barriers.
 *  - The first error of a launch aborts it (blocked cores are released and unwind), is stored in
 *    the stream (aclrtSynchronizeStream returns ACL_ERROR_RT_AICORE_EXCEPTION) and in the
 *    thread-local message of aclGetRecentErrMsg(). A wait without progress for 2 s while every
 *    core is blocked is a deadlock and reported the same way.
 */
#include <climits>
#include "acl/acl.h"

#include "../asc/include/basic_api/sim_core.h"

#include <array>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <shared_mutex>
#include <thread>

#define EXPORT extern "C" __attribute__((visibility("default")))

namespace {

using ascend_sim::CoreCtx;
using Clock = std::chrono::steady_clock;

/* ------------------------------------------------------------------------------------------ */
/* Process state                                                                               */
/* ------------------------------------------------------------------------------------------ */

constexpr const char* kSocName = "Ascend910B2";
constexpr int kAicCores = 24;               /* Ascend910B2: 24 AIC + 48 AIV (section 8) */
constexpr int kAivCores = 48;
constexpr int64_t kL2Bytes = 192ll << 20;
constexpr uint32_t kMaxNumBlocks = 65535;   /* section 1.2 */
constexpr int kCrossCoreFlags = 16;
constexpr int kMaxCrossCoreFlagId = 10;     /* 11..14 are used by SyncAll (section 1.7) */
constexpr int kMaxCrossCoreCount = 15;

std::mutex g_stateMutex;
bool g_inited = false;
bool g_finalized = false;
std::atomic<uint64_t> g_launchCount{0};
thread_local int t_device = -1;
thread_local std::string t_errMsg;
thread_local bool t_hasErr = false;
thread_local CoreCtx* t_core = nullptr;

/* Device allocations: begin -> end. */
std::shared_mutex g_memMutex;
std::map<uintptr_t, uintptr_t> g_devAllocs;
std::set<uintptr_t> g_hostAllocs;

std::mutex g_atomicMutex;

struct Stream {
    std::mutex m;
    aclError err = ACL_SUCCESS;
    std::string msg;
};
std::mutex g_streamMutex;
std::set<Stream*> g_streams;
Stream g_defaultStream;

bool quiet()
{
    static const bool q = std::getenv("ASCEND_SIM_QUIET") != nullptr;
    return q;
}

long deadlock_ms()
{
    static const long ms = [] {
        const char* e = std::getenv("ASCEND_SIM_DEADLOCK_MS");
        const long v = e ? std::strtol(e, nullptr, 10) : 0;
        return v > 0 ? v : 2000L;
    }();
    return ms;
}

aclError set_err(aclError code, const std::string& msg)
{
    t_errMsg = "ascend-sim: " + msg;
    t_hasErr = true;
    return code;
}

/* The checks every runtime call starts with: aclInit done, a device set on this thread. */
aclError need_init(const char* api)
{
    std::lock_guard<std::mutex> lk(g_stateMutex);
    if (!g_inited) return set_err(ACL_ERROR_UNINITIALIZE, std::string(api) + ": aclInit has not been called");
    return ACL_SUCCESS;
}
aclError need_device(const char* api)
{
    if (aclError e = need_init(api)) return e;
    if (t_device < 0) {
        return set_err(ACL_ERROR_RT_CONTEXT_NULL,
                       std::string(api) + ": no device set on this thread (call aclrtSetDevice(0) first)");
    }
    return ACL_SUCCESS;
}

bool in_device(const void* p, uint64_t bytes, uintptr_t* b = nullptr, uintptr_t* e = nullptr)
{
    const uintptr_t a = reinterpret_cast<uintptr_t>(p);
    if (p == nullptr || a + bytes < a) return false;
    std::shared_lock<std::shared_mutex> lk(g_memMutex);
    auto it = g_devAllocs.upper_bound(a);
    if (it == g_devAllocs.begin()) return false;
    --it;
    if (a < it->first || a + bytes > it->second || (bytes == 0 && a >= it->second)) return false;
    if (b) *b = it->first;
    if (e) *e = it->second;
    return true;
}

bool overlaps_device(const void* p, uint64_t bytes)
{
    const uintptr_t a = reinterpret_cast<uintptr_t>(p);
    std::shared_lock<std::shared_mutex> lk(g_memMutex);
    auto it = g_devAllocs.upper_bound(a + (bytes ? bytes - 1 : 0));
    if (it == g_devAllocs.begin()) return false;
    --it;
    return it->second > a;
}

Stream* resolve_stream(void* s)
{
    if (s == nullptr) return &g_defaultStream;
    std::lock_guard<std::mutex> lk(g_streamMutex);
    auto* st = static_cast<Stream*>(s);
    return g_streams.count(st) ? st : nullptr;
}

void stream_record(Stream* s, aclError code, const std::string& msg)
{
    std::lock_guard<std::mutex> lk(s->m);
    if (s->err == ACL_SUCCESS) {
        s->err = code;
        s->msg = msg;
    }
}

} // namespace

/* ------------------------------------------------------------------------------------------ */
/* Launch machinery                                                                            */
/* ------------------------------------------------------------------------------------------ */

namespace ascend_sim {

struct Group {              /* one AI core: its AIC and AIVs (mix), used by Matmul forwarding */
    int aic = -1;           /* core index */
    std::vector<int> aivs;  /* core indices */
    struct Request {
        const std::function<void()>* work;
        bool taken = false; /* the AIC is running it */
        bool done = false;
    };
    std::deque<Request*> requests;
    /* Per AIV (same order as `aivs`): how many REGIST_MATMUL_OBJ scopes it has left; INT_MAX
     * once it has exited the kernel. A kernel may hold several Matmul scopes one after another
     * (the opt_level-3 pipeline calls several matmul bodies): the AIC's n-th service session
     * ends when every AIV has left its n-th scope. */
    std::vector<int> quits;
    int sessions = 0;       /* service sessions the AIC has started */
    bool aicExited = false;
    bool aicServing = false;
};

struct Barrier {
    int arrived = 0;
    uint64_t gen = 0;
};

struct LaunchCtx {
    std::string name;
    int ktype = 0;
    uint32_t numBlocks = 0;
    std::mutex m;
    std::condition_variable cv;
    std::atomic<bool> aborted{false};
    bool hasError = false;
    std::string error;
    int running = 0;       /* core threads not blocked in a wait */
    uint64_t progress = 0; /* bumped by every state change other threads may wait for */
    std::vector<std::unique_ptr<CoreCtx>> cores;
    std::vector<char> exited;
    std::vector<std::string> waitingFor;
    std::vector<Group> groups;
    int nAiv = 0, nAic = 0;
    Barrier aivBarrier, allBarrier;
    std::vector<std::array<int, kCrossCoreFlags>> counters;  /* per core */
    std::array<std::array<int, kCrossCoreFlags>, 2> mode0{}; /* [aic][flag] arrivals */
    std::vector<std::array<int, kCrossCoreFlags>> mode1;     /* per group: AIV arrivals */
    std::vector<std::array<int, kCrossCoreFlags>> mode2;     /* per group: AIV -> AIC arrivals */

    void bump()
    {
        ++progress;
        cv.notify_all();
    }

    void record(const std::string& msg)
    {
        std::lock_guard<std::mutex> lk(m);
        if (!hasError) {
            hasError = true;
            error = msg;
            aborted.store(true);
        }
        cv.notify_all();
    }

    int index_of(const CoreCtx* c) const
    {
        for (size_t i = 0; i < cores.size(); ++i) {
            if (cores[i].get() == c) return static_cast<int>(i);
        }
        return -1;
    }

    std::string core_label(int i) const
    {
        const CoreCtx& c = *cores[static_cast<size_t>(i)];
        return msg("block ", c.blockIdx, " (", c.aic ? "AIC" : "AIV", ")");
    }

    /* Blocks the calling core (lock held) until ready() holds. ready() may fail() when the wait can
     * never complete. Reports a deadlock when every core of the launch is blocked and nothing
     * changed for ASCEND_SIM_DEADLOCK_MS (default 2000 ms). */
    template <class Ready>
    void wait(std::unique_lock<std::mutex>& lk, CoreCtx* c, const std::string& what, Ready ready)
    {
        const int me = index_of(c);
        struct Running {
            LaunchCtx& L;
            int me;
            Running(LaunchCtx& l, int i, const std::string& w) : L(l), me(i)
            {
                --L.running;
                L.waitingFor[static_cast<size_t>(me)] = w;
                L.cv.notify_all();
            }
            ~Running()
            {
                ++L.running;
                L.waitingFor[static_cast<size_t>(me)].clear();
            }
        } guard(*this, me, what);
        uint64_t seen = progress;
        auto since = Clock::now();
        const auto timeout = std::chrono::milliseconds(deadlock_ms());
        for (;;) {
            if (aborted.load()) throw_abort();
            if (ready()) break;
            cv.wait_for(lk, std::chrono::milliseconds(20));
            if (progress != seen) {
                seen = progress;
                since = Clock::now();
            } else if (running == 0 && Clock::now() - since >= timeout) {
                std::string who;
                for (size_t i = 0; i < cores.size() && who.size() < 600; ++i) {
                    if (!waitingFor[i].empty()) who += msg("; ", core_label(static_cast<int>(i)), ": ", waitingFor[i]);
                }
                fail(msg("deadlock: ", what, " made no progress for ", deadlock_ms(),
                         " ms while every core of the launch is blocked (hangs on hardware)", who));
            }
        }
        bump();
    }
};

} // namespace ascend_sim

namespace {

using ascend_sim::Group;
using ascend_sim::LaunchCtx;

LaunchCtx& launch_of(CoreCtx* c) { return *c->launch; }

bool is_mix(int ktype) { return ktype == KERNEL_TYPE_MIX_AIC_1_1 || ktype == KERNEL_TYPE_MIX_AIC_1_2; }

/* Inter-core sync needs the scheduler, which AIV_ONLY / AIC_ONLY kernels do not enable
 * (CrossCoreSetFlag(ISASI).md, SyncAll.md). */
bool has_cross_core(int ktype) { return ktype != KERNEL_TYPE_AIV_ONLY && ktype != KERNEL_TYPE_AIC_ONLY; }

/* Position of core `idx` among its group's AIVs. */
static size_t aiv_slot(const Group& g, int idx)
{
    for (size_t i = 0; i < g.aivs.size(); ++i) {
        if (g.aivs[i] == idx) return i;
    }
    return 0;
}

void core_exit(LaunchCtx& L, CoreCtx* c)
{
    std::lock_guard<std::mutex> lk(L.m);
    const int me = L.index_of(c);
    L.exited[static_cast<size_t>(me)] = 1;
    --L.running;
    Group& g = L.groups[static_cast<size_t>(c->group)];
    if (c->aic) {
        g.aicExited = true;
    } else {
        c->mmQuit = true;
        g.quits[aiv_slot(g, me)] = INT_MAX;
    }
    L.bump();
}

/* End-of-kernel checks that only warn (section 11.2: unmatched set at kernel end = warning). */
void end_checks(CoreCtx* c)
{
    for (int e = 0; e < ascend_sim::kHardEvents; ++e) {
        for (int id = 0; id < 8; ++id) {
            if (c->flags[e][id].set) {
                ascend_sim::warn(ascend_sim::msg("SetFlag<", ascend_sim::event_pipes(e).name, ">(", id,
                                                 ") was never waited before the kernel ended"));
            }
        }
    }
}

void core_main(LaunchCtx* L, CoreCtx* c, const std::function<void()>* body)
{
    t_core = c;
    try {
        (*body)();
        if (!L->aborted.load()) end_checks(c);
    } catch (const ascend_sim::Abort&) {
    } catch (const ascend_sim::KernelError& e) {
        L->record(e.what());
    } catch (const std::exception& e) {
        L->record(ascend_sim::msg("ascend-sim: ", L->name, " ", L->core_label(L->index_of(c)),
                                  ": uncaught exception: ", e.what()));
    } catch (...) {
        L->record(ascend_sim::msg("ascend-sim: ", L->name, " ", L->core_label(L->index_of(c)),
                                  ": uncaught non-standard exception"));
    }
    core_exit(*L, c);
    t_core = nullptr;
}

std::unique_ptr<CoreCtx> make_core(LaunchCtx& L, bool aic, int group, int64_t blockIdx, int64_t sub, int64_t subNum,
                                   int64_t ratio)
{
    auto c = std::make_unique<CoreCtx>();
    c->launch = &L;
    c->aborted = &L.aborted;
    c->kernel = L.name.c_str();
    c->aic = aic;
    c->ktype = L.ktype;
    c->group = group;
    c->blockIdx = blockIdx;
    c->blockNum = L.numBlocks;
    c->subBlockIdx = sub;
    c->subBlockNum = subNum;
    c->taskRatio = ratio;
    return c;
}

/* Core layout per kernel type (section 1.2). */
void build_cores(LaunchCtx& L)
{
    const int n = static_cast<int>(L.numBlocks);
    L.groups.resize(static_cast<size_t>(n));
    auto add = [&](std::unique_ptr<CoreCtx> c) {
        Group& g = L.groups[static_cast<size_t>(c->group)];
        const int idx = static_cast<int>(L.cores.size());
        if (c->aic) {
            g.aic = idx;
            ++L.nAic;
        } else {
            g.aivs.push_back(idx);
            g.quits.push_back(0);
            ++L.nAiv;
        }
        L.cores.push_back(std::move(c));
    };
    for (int g = 0; g < n; ++g) {
        switch (L.ktype) {
            case KERNEL_TYPE_AIV_ONLY:
            case KERNEL_TYPE_MIX_AIV_1_0: add(make_core(L, false, g, g, 0, 1, 1)); break;
            case KERNEL_TYPE_AIC_ONLY:
            case KERNEL_TYPE_MIX_AIC_1_0: add(make_core(L, true, g, g, 0, 1, 1)); break;
            case KERNEL_TYPE_MIX_AIC_1_1:
                add(make_core(L, true, g, g, 0, 1, 1));
                add(make_core(L, false, g, g, 0, 1, 1));
                break;
            default: /* KERNEL_TYPE_MIX_AIC_1_2 */
                add(make_core(L, true, g, g, 0, 1, 1));
                add(make_core(L, false, g, 2 * g, 0, 2, 2));
                add(make_core(L, false, g, 2 * g + 1, 1, 2, 2));
                break;
        }
    }
    const size_t nc = L.cores.size();
    L.exited.assign(nc, 0);
    L.waitingFor.assign(nc, std::string());
    L.counters.assign(nc, {});
    L.mode1.assign(static_cast<size_t>(n), {});
    L.mode2.assign(static_cast<size_t>(n), {});
}

/* numBlocks limits of the emulated Ascend910B2 (section 1.2, 8). */
std::string check_launch(int ktype, uint32_t nb)
{
    if (ktype < KERNEL_TYPE_AIV_ONLY || ktype > KERNEL_TYPE_MIX_AIC_1_2) {
        return ascend_sim::msg("kernel type ", ktype, " is not one of the six A2 kernel types");
    }
    if (nb < 1 || nb > kMaxNumBlocks) return ascend_sim::msg("numBlocks ", nb, " is outside 1..", kMaxNumBlocks);
    const bool vec = ktype == KERNEL_TYPE_AIV_ONLY || ktype == KERNEL_TYPE_MIX_AIV_1_0;
    const uint32_t limit = vec ? kAivCores : kAicCores;
    if (nb > limit) {
        return ascend_sim::msg("numBlocks ", nb, " exceeds the ", limit, vec ? " AIV cores" : " AI cores",
                               " of the emulated ", kSocName, " (", ascend_sim::ktype_name(ktype), ")");
    }
    return {};
}

} // namespace

/* ------------------------------------------------------------------------------------------ */
/* Functions exported to the kernel-side headers                                               */
/* ------------------------------------------------------------------------------------------ */
namespace ascend_sim {

CoreCtx* this_core() noexcept { return t_core; }

void fail(const std::string& what)
{
    CoreCtx* c = t_core;
    if (c == nullptr) throw KernelError("ascend-sim: " + what);
    throw KernelError(msg("ascend-sim: ", c->kernel, " block ", c->blockIdx, " (", c->aic ? "AIC" : "AIV", "): ", what));
}

void throw_abort() { throw Abort{}; }

void warn(const std::string& what) noexcept
{
    if (quiet()) return;
    CoreCtx* c = t_core;
    if (c != nullptr) {
        std::fprintf(stderr, "ascend-sim: %s block %lld (%s): warning: %s\n", c->kernel,
                     static_cast<long long>(c->blockIdx), c->aic ? "AIC" : "AIV", what.c_str());
    } else {
        std::fprintf(stderr, "ascend-sim: warning: %s\n", what.c_str());
    }
}

bool device_range(const void* p, uint64_t bytes, uintptr_t* begin, uintptr_t* end) noexcept
{
    try {
        return in_device(p, bytes, begin, end);
    } catch (...) {
        return false;
    }
}

void gm_atomic_lock() noexcept { g_atomicMutex.lock(); }
void gm_atomic_unlock() noexcept { g_atomicMutex.unlock(); }

/* SyncAll<isAIVOnly>() (section 1.7, SyncAll.md). */
void sync_all(bool aivOnly)
{
    CoreCtx* c = t_core;
    LaunchCtx& L = launch_of(c);
    const char* api = aivOnly ? "SyncAll<true>" : "SyncAll<false>";
    if (!has_cross_core(L.ktype)) {
        failf(api, " in a ", ktype_name(L.ktype),
              " kernel: the hardware barrier needs a mix kernel type (KERNEL_TYPE_MIX_AIV_1_0 / __mix__(0, 1) for "
              "vector-only kernels); it hangs on hardware");
    }
    if (aivOnly && c->aic) failf(api, " on an AIC: mix kernels synchronise all cores with SyncAll<false>()");
    if (!aivOnly && L.ktype == KERNEL_TYPE_MIX_AIV_1_0) {
        failf(api, " in a vector-only kernel: isAIVOnly must be true (it hangs on hardware)");
    }
    std::unique_lock<std::mutex> lk(L.m);
    Barrier& b = aivOnly ? L.aivBarrier : L.allBarrier;
    const int participants = aivOnly ? L.nAiv : L.nAiv + L.nAic;
    const uint64_t gen = b.gen;
    if (++b.arrived == participants) {
        b.arrived = 0;
        ++b.gen;
        L.bump();
        return;
    }
    L.bump();
    L.wait(lk, c, api, [&] {
        if (b.gen != gen) return true;
        for (size_t i = 0; i < L.cores.size(); ++i) {
            if (L.exited[i] && (!aivOnly || !L.cores[i]->aic)) {
                failf(api, ": ", L.core_label(static_cast<int>(i)),
                      " exited the kernel without reaching it (every launched core must reach SyncAll; hangs on "
                      "hardware)");
            }
        }
        return false;
    });
}

namespace {
void check_cross_core(CoreCtx* c, int mode, int pipe, int flagId, const char* api, bool isSet)
{
    LaunchCtx& L = launch_of(c);
    if (flagId < 0 || flagId > kMaxCrossCoreFlagId) {
        failf(api, "(", flagId, "): flag id outside 0..", kMaxCrossCoreFlagId, " (11..14 are used by SyncAll)");
    }
    if (!has_cross_core(L.ktype)) {
        failf(api, " in a ", ktype_name(L.ktype),
              " kernel: AIV_ONLY / AIC_ONLY kernels do not enable inter-core sync (use KERNEL_TYPE_MIX_AIV_1_0, "
              "MIX_AIC_1_0, MIX_AIC_1_1 or MIX_AIC_1_2)");
    }
    if (isSet && (pipe == PIPE_S || pipe == PIPE_ALL)) failf(api, ": the pipe must not be PIPE_S or PIPE_ALL");
    if (mode != 0 && mode != 1 && mode != 2) failf(api, ": mode ", mode, " (A2 supports modes 0, 1, 2)");
    if (mode != 0 && !is_mix(L.ktype)) {
        failf(api, ": mode ", mode, " needs KERNEL_TYPE_MIX_AIC_1_1 or MIX_AIC_1_2, not ", ktype_name(L.ktype));
    }
    if (isSet && mode == 1 && c->aic) failf(api, "<1>: mode 1 synchronises the AIVs of a core; called on an AIC");
}

void inc_counter(LaunchCtx& L, int core, int flagId)
{
    int& n = L.counters[static_cast<size_t>(core)][static_cast<size_t>(flagId)];
    if (n >= kMaxCrossCoreCount) {
        failf("CrossCoreSetFlag: flag ", flagId, " of ", L.core_label(core), " already has ", kMaxCrossCoreCount,
              " pending sets (counter overflow)");
    }
    ++n;
}
} // namespace

/* CrossCoreSetFlag<mode, pipe>(flagId) (section 1.7, CrossCoreSetFlag(ISASI).md, 关键特性说明.md). */
void cross_core_set(int mode, int pipe, int flagId)
{
    CoreCtx* c = t_core;
    const char* api = "CrossCoreSetFlag";
    check_cross_core(c, mode, pipe, flagId, api, true);
    LaunchCtx& L = launch_of(c);
    std::lock_guard<std::mutex> lk(L.m);
    Group& g = L.groups[static_cast<size_t>(c->group)];
    const size_t f = static_cast<size_t>(flagId);
    if (mode == 0) { /* all cores of this type set -> every core of the type counts one */
        int& arrived = L.mode0[c->aic ? 1 : 0][f];
        if (++arrived == (c->aic ? L.nAic : L.nAiv)) {
            arrived = 0;
            for (size_t i = 0; i < L.cores.size(); ++i) {
                if (L.cores[i]->aic == c->aic) inc_counter(L, static_cast<int>(i), flagId);
            }
        }
    } else if (mode == 1) { /* both AIVs of the core set -> each counts one */
        int& arrived = L.mode1[static_cast<size_t>(c->group)][f];
        if (++arrived == static_cast<int>(g.aivs.size())) {
            arrived = 0;
            for (int i : g.aivs) inc_counter(L, i, flagId);
        }
    } else if (c->aic) { /* mode 2, AIC sets -> each AIV counts one */
        for (int i : g.aivs) inc_counter(L, i, flagId);
    } else { /* mode 2, all AIVs set -> the AIC counts one */
        int& arrived = L.mode2[static_cast<size_t>(c->group)][f];
        if (++arrived == static_cast<int>(g.aivs.size())) {
            arrived = 0;
            inc_counter(L, g.aic, flagId);
        }
    }
    L.bump();
}

void cross_core_wait(int mode, int pipe, int flagId)
{
    CoreCtx* c = t_core;
    const char* api = "CrossCoreWaitFlag";
    check_cross_core(c, mode, pipe, flagId, api, false);
    LaunchCtx& L = launch_of(c);
    std::unique_lock<std::mutex> lk(L.m);
    const int me = L.index_of(c);
    int& n = L.counters[static_cast<size_t>(me)][static_cast<size_t>(flagId)];
    if (n == 0) L.wait(lk, c, msg(api, "(", flagId, ")"), [&] { return n > 0; });
    --n;
    L.bump();
}

/* Matmul MIX mode (section 3.1): the AIV posts the work to its AIC and waits for the reply. */
void matmul_call(const char* what, const std::function<void()>& work)
{
    CoreCtx* c = t_core;
    LaunchCtx& L = launch_of(c);
    std::unique_lock<std::mutex> lk(L.m);
    Group& g = L.groups[static_cast<size_t>(c->group)];
    if (g.aicExited) {
        failf("Matmul::", what, ": the AIC of this core exited without serving (it never reached "
              "REGIST_MATMUL_OBJ; hangs on hardware)");
    }
    Group::Request req{&work};
    g.requests.push_back(&req);
    L.bump();
    try {
        L.wait(lk, c, msg("Matmul::", what, " waiting for the AIC"), [&] {
            if (req.done) return true;
            if (g.aicExited) {
                failf("Matmul::", what, ": the AIC of this core exited without serving (it never reached "
                      "REGIST_MATMUL_OBJ; hangs on hardware)");
            }
            return false;
        });
    } catch (...) {
        /* the request refers to this frame: withdraw it, or let the AIC finish it first */
        if (req.taken) {
            while (!req.done) L.cv.wait(lk);
        } else {
            for (auto it = g.requests.begin(); it != g.requests.end(); ++it) {
                if (*it == &req) {
                    g.requests.erase(it);
                    break;
                }
            }
        }
        throw;
    }
}

void matmul_serve()
{
    CoreCtx* c = t_core;
    LaunchCtx& L = launch_of(c);
    std::unique_lock<std::mutex> lk(L.m);
    Group& g = L.groups[static_cast<size_t>(c->group)];
    g.aicServing = true;
    const int session = ++g.sessions;
    auto all_left = [&] {
        for (int q : g.quits) {
            if (q < session) return false;
        }
        return true;
    };
    for (;;) {
        if (g.requests.empty() && all_left()) break;
        if (g.requests.empty()) {
            L.wait(lk, c, "REGIST_MATMUL_OBJ serving its AIVs", [&] { return !g.requests.empty() || all_left(); });
            continue;
        }
        Group::Request* r = g.requests.front();
        g.requests.pop_front();
        r->taken = true;
        lk.unlock();
        try {
            (*r->work)(); /* runs on the AIC */
        } catch (...) {
            lk.lock();
            r->done = true; /* the AIV may be waiting to unwind its frame */
            L.bump();
            throw;
        }
        lk.lock();
        r->done = true;
        L.bump();
    }
    g.aicServing = false;
}

void matmul_client_quit() noexcept
{
    CoreCtx* c = t_core;
    if (c == nullptr || c->aic || c->mmQuit) return;
    LaunchCtx& L = launch_of(c);
    std::lock_guard<std::mutex> lk(L.m);
    c->mmQuit = true;
    Group& g = L.groups[static_cast<size_t>(c->group)];
    int& q = g.quits[aiv_slot(g, L.index_of(c))];
    if (q != INT_MAX) ++q;
    L.bump();
}

void run_kernel(const char* name, int ktype, uint32_t numBlocks, void* stream, uint8_t* kfcWorkspace,
                const std::function<void()>& body)
{
    Stream* s = resolve_stream(stream);
    if (s == nullptr) {
        set_err(ACL_ERROR_INVALID_PARAM, msg(name, ": launch on an unknown or destroyed stream"));
        if (!quiet()) std::fprintf(stderr, "%s\n", t_errMsg.c_str());
        return;
    }
    auto reject = [&](aclError code, const std::string& why) {
        const std::string m = msg("ascend-sim: ", name, ": launch error: ", why);
        stream_record(s, code, m);
        t_errMsg = m;
        t_hasErr = true;
        if (!quiet()) std::fprintf(stderr, "%s\n", m.c_str());
    };
    if (need_device("kernel launch") != ACL_SUCCESS) {
        reject(ACL_ERROR_RT_CONTEXT_NULL, "no aclInit / aclrtSetDevice on the launching thread");
        return;
    }
    const std::string bad = check_launch(ktype, numBlocks);
    if (!bad.empty()) {
        reject(ACL_ERROR_RT_PARAM_INVALID, bad);
        return;
    }
    ++g_launchCount;

    LaunchCtx L;
    L.name = name;
    L.ktype = ktype;
    L.numBlocks = numBlocks;
    build_cores(L);
    for (auto& c : L.cores) c->kfcWorkspace = kfcWorkspace;
    L.running = static_cast<int>(L.cores.size());
    std::vector<std::thread> threads;
    threads.reserve(L.cores.size());
    for (auto& c : L.cores) {
        try {
            threads.emplace_back(core_main, &L, c.get(), &body);
        } catch (const std::exception& e) {
            L.record(msg("ascend-sim: ", name, ": cannot start a core thread: ", e.what()));
            std::lock_guard<std::mutex> lk(L.m);
            const size_t i = static_cast<size_t>(L.index_of(c.get()));
            L.exited[i] = 1;
            --L.running;
        }
    }
    for (auto& t : threads) t.join();
    if (L.hasError) {
        stream_record(s, ACL_ERROR_RT_AICORE_EXCEPTION, L.error);
        t_errMsg = L.error;
        t_hasErr = true;
        if (!quiet()) std::fprintf(stderr, "%s\n", L.error.c_str());
    }
}

} // namespace ascend_sim

/* ------------------------------------------------------------------------------------------ */
/* AscendCL C API                                                                              */
/* ------------------------------------------------------------------------------------------ */

EXPORT aclError aclInit(const char* configPath)
{
    (void)configPath;
    std::lock_guard<std::mutex> lk(g_stateMutex);
    if (g_inited || g_finalized) {
        return set_err(ACL_ERROR_REPEAT_INITIALIZE, "aclInit: already initialised (once per process)");
    }
    g_inited = true;
    return ACL_SUCCESS;
}

EXPORT aclError aclFinalize(void)
{
    std::lock_guard<std::mutex> lk(g_stateMutex);
    if (g_finalized) return set_err(ACL_ERROR_REPEAT_FINALIZE, "aclFinalize: already finalised");
    if (!g_inited) return set_err(ACL_ERROR_UNINITIALIZE, "aclFinalize: aclInit has not been called");
    g_inited = false;
    g_finalized = true;
    return ACL_SUCCESS;
}

EXPORT const char* aclGetRecentErrMsg(void) { return t_hasErr ? t_errMsg.c_str() : nullptr; }

EXPORT aclError aclrtGetVersion(int32_t* majorVersion, int32_t* minorVersion, int32_t* patchVersion)
{
    if (!majorVersion || !minorVersion || !patchVersion) {
        return set_err(ACL_ERROR_INVALID_PARAM, "aclrtGetVersion: null pointer");
    }
    *majorVersion = ACL_MAJOR_VERSION;
    *minorVersion = ACL_MINOR_VERSION;
    *patchVersion = ACL_PATCH_VERSION;
    return ACL_SUCCESS;
}

EXPORT aclError aclrtGetDeviceCount(uint32_t* count)
{
    if (aclError e = need_init("aclrtGetDeviceCount")) return e;
    if (!count) return set_err(ACL_ERROR_INVALID_PARAM, "aclrtGetDeviceCount: null pointer");
    *count = 1;
    return ACL_SUCCESS;
}

EXPORT aclError aclrtSetDevice(int32_t deviceId)
{
    if (aclError e = need_init("aclrtSetDevice")) return e;
    if (deviceId != 0) {
        return set_err(ACL_ERROR_RT_INVALID_DEVICEID,
                       ascend_sim::msg("aclrtSetDevice(", deviceId, "): the sim has one device, id 0"));
    }
    t_device = 0;
    return ACL_SUCCESS;
}

EXPORT aclError aclrtResetDevice(int32_t deviceId)
{
    if (aclError e = need_init("aclrtResetDevice")) return e;
    if (deviceId != 0) {
        return set_err(ACL_ERROR_RT_INVALID_DEVICEID,
                       ascend_sim::msg("aclrtResetDevice(", deviceId, "): the sim has one device, id 0"));
    }
    t_device = -1;
    return ACL_SUCCESS;
}

EXPORT aclError aclrtGetDevice(int32_t* deviceId)
{
    if (aclError e = need_device("aclrtGetDevice")) return e;
    if (!deviceId) return set_err(ACL_ERROR_INVALID_PARAM, "aclrtGetDevice: null pointer");
    *deviceId = t_device;
    return ACL_SUCCESS;
}

EXPORT const char* aclrtGetSocName(void) { return kSocName; }

EXPORT aclError aclGetDeviceCapability(uint32_t deviceId, aclDeviceInfo deviceInfo, int64_t* value)
{
    if (aclError e = need_init("aclGetDeviceCapability")) return e;
    if (deviceId != 0) {
        return set_err(ACL_ERROR_RT_INVALID_DEVICEID,
                       ascend_sim::msg("aclGetDeviceCapability(", deviceId, "): the sim has one device, id 0"));
    }
    if (!value) return set_err(ACL_ERROR_INVALID_PARAM, "aclGetDeviceCapability: null value pointer");
    switch (deviceInfo) {
        case ACL_DEVICE_INFO_AI_CORE_NUM: *value = kAicCores; return ACL_SUCCESS;
        case ACL_DEVICE_INFO_VECTOR_CORE_NUM: *value = kAivCores; return ACL_SUCCESS;
        case ACL_DEVICE_INFO_L2_SIZE: *value = kL2Bytes; return ACL_SUCCESS;
        default:
            return set_err(ACL_ERROR_INVALID_PARAM,
                           ascend_sim::msg("aclGetDeviceCapability: unknown aclDeviceInfo ", int(deviceInfo)));
    }
}

EXPORT aclError aclrtCreateStream(aclrtStream* stream)
{
    if (aclError e = need_device("aclrtCreateStream")) return e;
    if (!stream) return set_err(ACL_ERROR_INVALID_PARAM, "aclrtCreateStream: null pointer");
    auto* s = new Stream;
    std::lock_guard<std::mutex> lk(g_streamMutex);
    g_streams.insert(s);
    *stream = s;
    return ACL_SUCCESS;
}

EXPORT aclError aclrtDestroyStream(aclrtStream stream)
{
    if (aclError e = need_device("aclrtDestroyStream")) return e;
    std::lock_guard<std::mutex> lk(g_streamMutex);
    auto* s = static_cast<Stream*>(stream);
    if (!stream || !g_streams.count(s)) {
        return set_err(ACL_ERROR_INVALID_PARAM, "aclrtDestroyStream: not a stream created by aclrtCreateStream");
    }
    g_streams.erase(s);
    delete s;
    return ACL_SUCCESS;
}

/* Launches are synchronous: this returns (and clears) the first error recorded in the stream. */
EXPORT aclError aclrtSynchronizeStream(aclrtStream stream)
{
    if (aclError e = need_device("aclrtSynchronizeStream")) return e;
    Stream* s = resolve_stream(stream);
    if (s == nullptr) return set_err(ACL_ERROR_INVALID_PARAM, "aclrtSynchronizeStream: unknown stream");
    std::lock_guard<std::mutex> lk(s->m);
    const aclError err = s->err;
    if (err != ACL_SUCCESS) {
        t_errMsg = s->msg;
        t_hasErr = true;
    }
    s->err = ACL_SUCCESS;
    s->msg.clear();
    return err;
}

EXPORT aclError aclrtSynchronizeDevice(void)
{
    if (aclError e = need_device("aclrtSynchronizeDevice")) return e;
    aclError first = aclrtSynchronizeStream(nullptr);
    std::vector<Stream*> all;
    {
        std::lock_guard<std::mutex> lk(g_streamMutex);
        all.assign(g_streams.begin(), g_streams.end());
    }
    for (Stream* s : all) {
        const aclError e = aclrtSynchronizeStream(s);
        if (first == ACL_SUCCESS) first = e;
    }
    return first;
}

EXPORT aclError aclrtMalloc(void** devPtr, size_t size, aclrtMemMallocPolicy policy)
{
    if (aclError e = need_device("aclrtMalloc")) return e;
    if (!devPtr) return set_err(ACL_ERROR_INVALID_PARAM, "aclrtMalloc: null pointer");
    if (size == 0) return set_err(ACL_ERROR_INVALID_PARAM, "aclrtMalloc: size 0");
    if (static_cast<int>(policy) < 0 || static_cast<int>(policy) > ACL_MEM_MALLOC_NORMAL_ONLY_P2P) {
        return set_err(ACL_ERROR_INVALID_PARAM, ascend_sim::msg("aclrtMalloc: unknown policy ", int(policy)));
    }
    const size_t rounded = (size + 511) / 512 * 512;
    void* p = std::aligned_alloc(512, rounded);
    if (!p) return set_err(ACL_ERROR_RT_MEMORY_ALLOCATION, ascend_sim::msg("aclrtMalloc: out of memory (", size, " bytes)"));
    std::memset(p, ascend_sim::kPoison, rounded); /* device memory is not zeroed */
    std::unique_lock<std::shared_mutex> lk(g_memMutex);
    g_devAllocs[reinterpret_cast<uintptr_t>(p)] = reinterpret_cast<uintptr_t>(p) + size;
    *devPtr = p;
    return ACL_SUCCESS;
}

EXPORT aclError aclrtFree(void* devPtr)
{
    if (aclError e = need_device("aclrtFree")) return e;
    std::unique_lock<std::shared_mutex> lk(g_memMutex);
    auto it = g_devAllocs.find(reinterpret_cast<uintptr_t>(devPtr));
    if (!devPtr || it == g_devAllocs.end()) {
        return set_err(ACL_ERROR_INVALID_PARAM, "aclrtFree: not the start of an aclrtMalloc allocation");
    }
    g_devAllocs.erase(it);
    std::free(devPtr);
    return ACL_SUCCESS;
}

EXPORT aclError aclrtMallocHost(void** hostPtr, size_t size)
{
    if (aclError e = need_device("aclrtMallocHost")) return e;
    if (!hostPtr || size == 0) return set_err(ACL_ERROR_INVALID_PARAM, "aclrtMallocHost: null pointer or size 0");
    void* p = std::aligned_alloc(64, (size + 63) / 64 * 64);
    if (!p) return set_err(ACL_ERROR_RT_MEMORY_ALLOCATION, "aclrtMallocHost: out of memory");
    std::unique_lock<std::shared_mutex> lk(g_memMutex);
    g_hostAllocs.insert(reinterpret_cast<uintptr_t>(p));
    *hostPtr = p;
    return ACL_SUCCESS;
}

EXPORT aclError aclrtFreeHost(void* hostPtr)
{
    if (aclError e = need_device("aclrtFreeHost")) return e;
    std::unique_lock<std::shared_mutex> lk(g_memMutex);
    if (!hostPtr || !g_hostAllocs.erase(reinterpret_cast<uintptr_t>(hostPtr))) {
        return set_err(ACL_ERROR_INVALID_PARAM, "aclrtFreeHost: not an aclrtMallocHost allocation");
    }
    std::free(hostPtr);
    return ACL_SUCCESS;
}

namespace {
/* Each side of a copy must be what `kind` says: device = inside one aclrtMalloc allocation,
 * host = not overlapping device memory. */
aclError check_side(const void* p, size_t n, bool device, const char* api, const char* side, aclrtMemcpyKind kind)
{
    if (device) {
        if (!in_device(p, n)) {
            return set_err(ACL_ERROR_INVALID_PARAM,
                           ascend_sim::msg(api, ": ", side, " [", ascend_sim::Hex{reinterpret_cast<uintptr_t>(p)}, ", +",
                                           n, " bytes) is not inside a device allocation (kind ", int(kind), ")"));
        }
    } else if (overlaps_device(p, n)) {
        return set_err(ACL_ERROR_INVALID_PARAM,
                       ascend_sim::msg(api, ": ", side, " ", ascend_sim::Hex{reinterpret_cast<uintptr_t>(p)},
                                       " is device memory but the copy kind ", int(kind), " says host"));
    }
    return ACL_SUCCESS;
}

aclError memcpy_impl(void* dst, size_t destMax, const void* src, size_t count, aclrtMemcpyKind kind, const char* api)
{
    if (aclError e = need_device(api)) return e;
    if (count == 0) return ACL_SUCCESS;
    if (!dst || !src) return set_err(ACL_ERROR_INVALID_PARAM, ascend_sim::msg(api, ": null pointer"));
    if (count > destMax) {
        return set_err(ACL_ERROR_INVALID_PARAM, ascend_sim::msg(api, ": count ", count, " > destMax ", destMax));
    }
    bool dstDev, srcDev;
    switch (kind) {
        case ACL_MEMCPY_HOST_TO_HOST: dstDev = false; srcDev = false; break;
        case ACL_MEMCPY_HOST_TO_DEVICE: dstDev = true; srcDev = false; break;
        case ACL_MEMCPY_DEVICE_TO_HOST: dstDev = false; srcDev = true; break;
        case ACL_MEMCPY_DEVICE_TO_DEVICE: dstDev = true; srcDev = true; break;
        case ACL_MEMCPY_DEFAULT: dstDev = in_device(dst, count); srcDev = in_device(src, count); break;
        default: return set_err(ACL_ERROR_INVALID_PARAM, ascend_sim::msg(api, ": unknown copy kind ", int(kind)));
    }
    if (aclError e = check_side(dst, count, dstDev, api, "dst", kind)) return e;
    if (aclError e = check_side(src, count, srcDev, api, "src", kind)) return e;
    std::memmove(dst, src, count);
    return ACL_SUCCESS;
}
} // namespace

EXPORT aclError aclrtMemcpy(void* dst, size_t destMax, const void* src, size_t count, aclrtMemcpyKind kind)
{
    return memcpy_impl(dst, destMax, src, count, kind, "aclrtMemcpy");
}

EXPORT aclError aclrtMemcpyAsync(void* dst, size_t destMax, const void* src, size_t count, aclrtMemcpyKind kind,
                                 aclrtStream stream)
{
    if (aclError e = need_device("aclrtMemcpyAsync")) return e;
    if (resolve_stream(stream) == nullptr) return set_err(ACL_ERROR_INVALID_PARAM, "aclrtMemcpyAsync: unknown stream");
    return memcpy_impl(dst, destMax, src, count, kind, "aclrtMemcpyAsync");
}

EXPORT aclError aclrtMemset(void* devPtr, size_t maxCount, int32_t value, size_t count)
{
    if (aclError e = need_device("aclrtMemset")) return e;
    if (count > maxCount) {
        return set_err(ACL_ERROR_INVALID_PARAM, ascend_sim::msg("aclrtMemset: count ", count, " > maxCount ", maxCount));
    }
    if (count == 0) return ACL_SUCCESS;
    if (!in_device(devPtr, count)) {
        return set_err(ACL_ERROR_INVALID_PARAM, ascend_sim::msg("aclrtMemset: [", ascend_sim::Hex{reinterpret_cast<uintptr_t>(devPtr)},
                                                                ", +", count, " bytes) is not inside a device allocation"));
    }
    std::memset(devPtr, value, count);
    return ACL_SUCCESS;
}

EXPORT float aclFloat16ToFloat(aclFloat16 value) { return ascend_sim::f32_from_f16(value); }
EXPORT aclFloat16 aclFloatToFloat16(float value) { return ascend_sim::f16_from_f32(value); }

EXPORT uint64_t ascend_sim_launch_count(void) { return g_launchCount.load(); }
