/*
 * ascend-sim: the host side of `kernel<<<numBlocks, l2ctrl, stream>>>(args...)`.
 *
 * The bisheng wrapper rewrites the launch syntax into
 *     ::ascend_sim::launch(kernel, "kernel", KERNEL_TYPE_xxx, KFC, numBlocks, l2ctrl, stream)(args...)
 * where KFC is the index of the kernel's `__kfc_workspace__` parameter (-1: none); that argument
 * is loaded into the kfc workspace register of every core (what GetSysWorkSpacePtr() and
 * GetUserWorkspace() read on arch 2201).
 * The arguments are converted to the kernel's parameter types exactly like a function call, copied
 * once, and every core thread calls the kernel with its own copy (docs/ascend-c.md 5.1; kernel
 * arguments are pointers, scalars and POD structs, 11.8 item 9).
 */
#ifndef ASCEND_SIM_SIM_LAUNCH_H
#define ASCEND_SIM_SIM_LAUNCH_H

#include "sim_core.h"

#include <tuple>

namespace ascend_sim {

template <class F>
class KernelLauncher {
    static_assert(sizeof(F) == 0, "ascend-sim: a kernel launched with <<<>>> must be a function returning void");
};

template <class... P>
class KernelLauncher<void (*)(P...)> {
    static_assert(((std::is_trivially_copyable_v<P> && !std::is_reference_v<P>) && ...),
                  "ascend-sim: kernel arguments must be pointers, scalars or POD structs passed by value "
                  "(docs/ascend-c.md 11.8 item 9)");

public:
    KernelLauncher(void (*fn)(P...), const char* name, int ktype, int kfc, int64_t numBlocks, void* stream)
        : fn_(fn), name_(name), ktype_(ktype), kfc_(kfc), numBlocks_(numBlocks), stream_(stream)
    {}

    void operator()(P... args) const
    {
        const std::tuple<P...> copied(args...);
        const uint32_t nb = (numBlocks_ < 0 || numBlocks_ > 0xffffffffll) ? 0u : static_cast<uint32_t>(numBlocks_);
        uint8_t* kfc = kfc_workspace(copied, std::index_sequence_for<P...>{});
        run_kernel(name_, ktype_, nb, stream_, kfc, [this, &copied] { std::apply(fn_, copied); });
    }

private:
    /* The argument at index kfc_ when it is a pointer (the wrapper only marks pointer parameters). */
    template <size_t... I>
    uint8_t* kfc_workspace(const std::tuple<P...>& a, std::index_sequence<I...>) const
    {
        uint8_t* out = nullptr;
        auto pick = [&](size_t i, const auto& v) {
            if constexpr (std::is_pointer_v<std::decay_t<decltype(v)>>) {
                if (static_cast<int>(i) == kfc_) out = (uint8_t*)(v);
            }
        };
        (pick(I, std::get<I>(a)), ...);
        (void)pick; /* a kernel without parameters */
        (void)a;
        return out;
    }

    void (*fn_)(P...);
    const char* name_;
    int ktype_;
    int kfc_;
    int64_t numBlocks_;
    void* stream_;
};

inline void* as_stream(void* s) { return s; }
inline void* as_stream(std::nullptr_t) { return nullptr; }

/* `l2ctrl` (older toolkits) / `dynUBufSize` (newer): accepted and ignored. The kernel is taken as
 * a deduced function pointer so template-ids like `k<float>` resolve to their specialisation. */
template <class F, class N, class L2, class S>
KernelLauncher<F> launch(F fn, const char* name, int ktype, int kfc, N numBlocks, const L2&, S stream)
{
    static_assert(std::is_integral_v<N>, "ascend-sim: numBlocks must be an integer");
    return KernelLauncher<F>(fn, name, ktype, kfc, static_cast<int64_t>(numBlocks), as_stream(stream));
}

} // namespace ascend_sim

#endif // ASCEND_SIM_SIM_LAUNCH_H
