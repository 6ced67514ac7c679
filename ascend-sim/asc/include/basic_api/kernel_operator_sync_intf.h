/*
 * ascend-sim: core identity, intra-core sync (SetFlag/WaitFlag/PipeBarrier), inter-core sync
 * (SyncAll, CrossCoreSetFlag/WaitFlag), workspace and atomic-mode setters
 * (docs/ascend-c.md 1.2, 1.7, 11.2; invariants 11.8 items 4 and 10).
 */
#ifndef ASCEND_SIM_KERNEL_OPERATOR_SYNC_INTF_H
#define ASCEND_SIM_KERNEL_OPERATOR_SYNC_INTF_H

#include "kernel_tensor.h"

/* `if ASCEND_IS_AIV { ... }`: true on the vector cores of the launch (section 1.2). */
#define ASCEND_IS_AIV (::ascend_sim::is_aiv())
#define ASCEND_IS_AIC (::ascend_sim::is_aic())
#define ASCEND_IS_NOT_AIV (!::ascend_sim::is_aiv())
#define ASCEND_IS_NOT_AIC (!::ascend_sim::is_aic())
/* `g_coreType == AscendC::AIV` */
#define g_coreType (::ascend_sim::is_aic() ? ::AscendC::AIC : ::AscendC::AIV)

namespace AscendC {

/* ---- Core identity (section 1.2): mix AIV index = 2 * group + sub; GetBlockNum() = numBlocks on
 * both core types; GetTaskRatio() = AIVs per AIC on the AIV, 1 on the AIC. ---- */
inline int64_t GetBlockIdx() { return ascend_sim::core().blockIdx; }
inline int64_t GetBlockNum() { return ascend_sim::core().blockNum; }
inline int64_t GetSubBlockIdx() { return ascend_sim::core().subBlockIdx; }
inline int64_t GetSubBlockNum() { return ascend_sim::core().subBlockNum; }
inline int64_t GetTaskRatio() { return ascend_sim::core().taskRatio; }

/* ---- SetFlag / WaitFlag (section 1.7): ids 0..7; a set must be waited before it is set again;
 * a wait needs a prior set (it hangs on hardware otherwise). A completed pair orders the source
 * pipe's earlier accesses before the destination pipe's later ones (hazard tracker). ---- */
template <HardEvent event>
void SetFlag(int32_t eventID)
{
    using namespace ascend_sim;
    CoreCtx& c = core();
    const EventPipes& ep = event_pipes(static_cast<int>(event));
    if (eventID < 0 || eventID > 7) failf("SetFlag<", ep.name, ">(", eventID, "): event id outside 0..7");
    CoreCtx::Flag& f = c.flags[static_cast<int>(event)][eventID];
    if (f.set) {
        failf("SetFlag<", ep.name, ">(", eventID,
              ") set twice without a WaitFlag in between (PipeBarrier<PIPE_ALL> then hangs on hardware)");
    }
    f.set = true;
    f.seq = ++c.seq;
}

template <HardEvent event>
void WaitFlag(int32_t eventID)
{
    using namespace ascend_sim;
    CoreCtx& c = core();
    const EventPipes& ep = event_pipes(static_cast<int>(event));
    if (eventID < 0 || eventID > 7) failf("WaitFlag<", ep.name, ">(", eventID, "): event id outside 0..7");
    CoreCtx::Flag& f = c.flags[static_cast<int>(event)][eventID];
    if (!f.set) failf("WaitFlag<", ep.name, ">(", eventID, ") without a prior SetFlag (hangs on hardware)");
    f.set = false;
    uint64_t& o = c.ordered[ep.src][ep.dst];
    if (f.seq > o) o = f.seq;
    ++c.seq;
}

/* Cross-version wrapper: TQueSync<src, dst>::SetFlag / WaitFlag (section 1.7). */
template <pipe_t src, pipe_t dst>
class TQueSync {
public:
    void SetFlag(TEventID id) { dispatch(true, id); }
    void WaitFlag(TEventID id) { dispatch(false, id); }

private:
    template <int E = 0>
    static void call(int ev, bool set, TEventID id)
    {
        if constexpr (E < ascend_sim::kHardEvents) {
            if (ev == E) {
                if (set) AscendC::SetFlag<static_cast<HardEvent>(E)>(id);
                else AscendC::WaitFlag<static_cast<HardEvent>(E)>(id);
                return;
            }
            call<E + 1>(ev, set, id);
        }
    }
    static void dispatch(bool set, TEventID id)
    {
        const uint8_t s = ascend_sim::pipe_index(src), d = ascend_sim::pipe_index(dst);
        for (int e = 0; e < ascend_sim::kHardEvents; ++e) {
            const ascend_sim::EventPipes& ep = ascend_sim::event_pipes(e);
            if (ep.src == s && ep.dst == d) return call(e, set, id);
        }
        ascend_sim::core();
        ascend_sim::failf("TQueSync: no hardware event from PIPE_", ascend_sim::pipe_name(s), " to PIPE_",
                          ascend_sim::pipe_name(d));
    }
};

/* PipeBarrier<p>(): PIPE_S is not allowed; PIPE_ALL orders every earlier access. */
template <pipe_t pipe>
void PipeBarrier()
{
    using namespace ascend_sim;
    CoreCtx& c = core();
    if constexpr (pipe == PIPE_S) {
        failf("PipeBarrier<PIPE_S> is not allowed (section 1.7)");
    } else if constexpr (pipe == PIPE_ALL) {
        c.barrierAll = ++c.seq;
    } else {
        ++c.seq;
    }
}

/* ---- Inter-core sync (section 1.7). ---- */
/* Hardware all-core barrier: all AIVs of the launch (isAIVOnly) or every core of a mix launch. */
template <bool isAIVOnly = true>
void SyncAll()
{
    ascend_sim::core();
    ascend_sim::sync_all(isAIVOnly);
}

/* Counting semaphores per core and flag id (ids 0..10, at most 15 pending); modes 0 (all cores of
 * one type), 1 (the AIVs of a group), 2 (AIC <-> its AIVs). */
template <uint8_t modeId, pipe_t pipe>
void CrossCoreSetFlag(uint16_t flagId)
{
    ascend_sim::core();
    ascend_sim::cross_core_set(modeId, pipe, flagId);
}
template <uint8_t modeId = 0, pipe_t pipe = PIPE_S>
void CrossCoreWaitFlag(uint16_t flagId)
{
    ascend_sim::core();
    ascend_sim::cross_core_wait(modeId, pipe, flagId);
}

inline void SetSyncBaseAddr(uint64_t) { ascend_sim::core(); }
inline void SetNextTaskStart() { ascend_sim::core(); }
inline void WaitPreTaskEnd() { ascend_sim::core(); }

enum class CacheLine : uint8_t { SINGLE_CACHE_LINE = 0, ENTIRE_DATA_CACHE };
enum class DcciDst : uint8_t { CACHELINE_ALL = 0, CACHELINE_UB, CACHELINE_OUT, CACHELINE_ATOMIC };
/* The sim has no data cache: GM accesses are coherent. */
template <typename T, CacheLine entireType, DcciDst dcciDst>
void DataCacheCleanAndInvalid(const GlobalTensor<T>&)
{
    ascend_sim::core();
}
template <typename T, CacheLine entireType>
void DataCacheCleanAndInvalid(const GlobalTensor<T>&)
{
    ascend_sim::core();
}

/* ---- Workspace (section 3.1, 11.3), as on arch 2201 (asc-devkit impl/basic_api/dav_c220/
 * kernel_operator_common_impl.h, include/basic_api/kernel_operator_swap_mem_intf.h): the system
 * workspace is the kfc workspace register, which the launch loads from the kernel's
 * `__kfc_workspace__` parameter; GetUserWorkspace ignores its argument and returns the register
 * + GetLibApiWorkSpaceSize(). SetSysWorkspace is deprecated and changes neither. ---- */
[[deprecated("NOTICE: SetSysWorkSpace has been deprecated and will be removed in the next version.")]]
inline void SetSysWorkspace(GM_ADDR workspace)
{
    ascend_sim::CoreCtx& c = ascend_sim::core();
    if (c.sysWorkspace == nullptr) c.sysWorkspace = workspace;
}
inline GM_ADDR GetUserWorkspace(GM_ADDR)
{
    ascend_sim::CoreCtx& c = ascend_sim::core();
    if (c.kfcWorkspace == nullptr) {
        ascend_sim::fail("GetUserWorkspace: the kfc workspace register is empty: mark the kernel's workspace "
                         "parameter __kfc_workspace__ (on arch 2201 the user workspace is found from it, not from "
                         "the argument)");
    }
    return c.kfcWorkspace + ASCEND_SIM_SYS_WORKSPACE;
}

/* ---- Atomic accumulation of UB -> GM copies (section 11.5). ---- */
template <typename T>
void SetAtomicAdd()
{
    ascend_sim::core().atomicType = ascend_sim::type_code<T>();
}
inline void SetAtomicNone() { ascend_sim::core().atomicType = 0; }
inline void DisableDmaAtomic() { ascend_sim::core().atomicType = 0; }

} // namespace AscendC

/* In the global namespace, as in the official headers. */
inline GM_ADDR GetSysWorkSpacePtr() { return ascend_sim::core().kfcWorkspace; }

#endif // ASCEND_SIM_KERNEL_OPERATOR_SYNC_INTF_H
