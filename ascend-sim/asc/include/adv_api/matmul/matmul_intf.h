/*
 * ascend-sim: the Matmul high-level API in MIX mode (docs/ascend-c.md 3.1, 3.2, 11.7).
 *
 * Supported: GM/ND operands, A/B in half, bfloat16_t or float, C in float, half or bfloat16_t,
 * bias in float or half; SetTensorA/B (with transposes), SetBias/DisableBias, SetOrgShape,
 * SetSingleShape/SetTail, IterateAll to GM (enAtomic 0/1), End.
 *
 * MIX mode: only the AIVs call the methods. IterateAll is forwarded to the AIC of the same group,
 * which computes C = A x B (+ bias) with fp32 accumulation and replies. REGIST_MATMUL_OBJ on the
 * AIC validates the tilings, reserves their L1 and then serves its AIVs until each has left the
 * scope that contains its REGIST_MATMUL_OBJ (or the kernel) — like the toolkit, whose KFC client
 * sends "quit" from its destructor — and then RETURNS from the enclosing function.
 */
#ifndef ASCEND_SIM_MATMUL_INTF_H
#define ASCEND_SIM_MATMUL_INTF_H

#include "../../kernel_operator.h"
#include "tcube_tiling.h"

namespace AscendC {

enum class LayoutMode : uint8_t { NONE = 0, BSNGD, SBNGD, BNGS1S2, NORMAL };

template <TPosition POS, CubeFormat FORMAT, typename TYPE, bool ISTRANS = false, LayoutMode LAYOUT = LayoutMode::NONE,
          bool IBSHARE = false, TPosition SRCPOS = TPosition::GM>
struct MatmulType {
    constexpr static TPosition pos = POS;
    constexpr static CubeFormat format = FORMAT;
    using T = TYPE;
    constexpr static bool isTrans = ISTRANS;
    constexpr static LayoutMode layout = LAYOUT;
    constexpr static bool ibShare = IBSHARE;
    constexpr static TPosition srcPos = SRCPOS;
};

/* Template configuration; the sim computes every configuration the same way. */
struct MatmulConfig {
    bool doNorm = true;
    bool doMultiDataLoad = false;
    bool intrinsicsCheck = false;
    bool enableSetBias = true;
};
inline constexpr MatmulConfig CFG_NORM = {true, false, false, true};
inline constexpr MatmulConfig CFG_MDL = {false, true, false, true};
constexpr MatmulConfig GetNormalConfig() { return CFG_NORM; }
constexpr MatmulConfig GetMDLConfig() { return CFG_MDL; }

} // namespace AscendC

namespace ascend_sim {

constexpr int kMaxMatmulObjects = 4;

inline bool ktype_is_mix_matmul(int t) { return t == KERNEL_TYPE_MIX_AIC_1_1 || t == KERNEL_TYPE_MIX_AIC_1_2; }

/* TCubeTiling validity (section 3.2, TCubeTiling结构体.md table 2); errors name the field. */
inline void validate_tiling(const AscendC::tiling::TCubeTiling& t, uint32_t sa, uint32_t sb, uint32_t sbias,
                            bool floatA, uint32_t l1Free)
{
    const char* w = "REGIST_MATMUL_OBJ: tiling.";
    auto positive = [&](int32_t v, const char* f) {
        if (v <= 0) failf(w, f, " = ", v, " must be > 0");
    };
    positive(t.M, "M");
    positive(t.N, "N");
    positive(t.Ka, "Ka");
    positive(t.Kb, "Kb");
    positive(t.singleCoreM, "singleCoreM");
    positive(t.singleCoreN, "singleCoreN");
    positive(t.singleCoreK, "singleCoreK");
    positive(t.baseM, "baseM");
    positive(t.baseN, "baseN");
    positive(t.baseK, "baseK");
    positive(t.depthA1, "depthA1");
    positive(t.depthB1, "depthB1");
    positive(t.stepM, "stepM");
    positive(t.stepN, "stepN");
    positive(t.stepKa, "stepKa");
    positive(t.stepKb, "stepKb");
    if (t.usedCoreNum < 1 || t.usedCoreNum > 48) failf(w, "usedCoreNum = ", t.usedCoreNum, " outside 1..48");
    if (t.singleCoreM > t.M) failf(w, "singleCoreM = ", t.singleCoreM, " > M = ", t.M);
    if (t.singleCoreN > t.N) failf(w, "singleCoreN = ", t.singleCoreN, " > N = ", t.N);
    if (t.singleCoreK > t.Ka) failf(w, "singleCoreK = ", t.singleCoreK, " > Ka = ", t.Ka);
    if (t.baseM % 16 != 0) failf(w, "baseM = ", t.baseM, " is not a multiple of 16");
    if (t.baseN % 16 != 0) failf(w, "baseN = ", t.baseN, " is not a multiple of 16");
    const int kAlign = floatA ? 8 : 16;
    if (t.baseK % kAlign != 0) failf(w, "baseK = ", t.baseK, " is not a multiple of ", kAlign);
    for (auto [v, f] : {std::pair<int32_t, const char*>{t.dbL0A, "dbL0A"}, {t.dbL0B, "dbL0B"}, {t.dbL0C, "dbL0C"}}) {
        if (v != 1 && v != 2) failf(w, f, " = ", v, " must be 1 or 2");
    }
    if (t.iterateOrder != 0 && t.iterateOrder != 1) failf(w, "iterateOrder = ", t.iterateOrder, " must be 0 or 1");
    if (t.isBias != 0 && t.isBias != 1) failf(w, "isBias = ", t.isBias, " must be 0 or 1");
    const uint64_t l0a = uint64_t(t.baseM) * t.baseK * sa * t.dbL0A;
    if (l0a > 65536) failf(w, "baseM * baseK * sizeof(A) * dbL0A = ", l0a, " > L0A 65536 bytes");
    const uint64_t l0b = uint64_t(t.baseN) * t.baseK * sb * t.dbL0B;
    if (l0b > 65536) failf(w, "baseN * baseK * sizeof(B) * dbL0B = ", l0b, " > L0B 65536 bytes");
    const uint64_t l0c = uint64_t(t.baseM) * t.baseN * 4 * t.dbL0C;
    if (l0c > 131072) failf(w, "baseM * baseN * 4 * dbL0C = ", l0c, " > L0C 131072 bytes");
    const int32_t sa1 = t.stepM * t.stepKa, sb1 = t.stepN * t.stepKb;
    if (t.depthA1 != sa1 && t.depthA1 != 2 * sa1) {
        failf(w, "depthA1 = ", t.depthA1, " must be stepM * stepKa * db = ", sa1, " or ", 2 * sa1);
    }
    if (t.depthB1 != sb1 && t.depthB1 != 2 * sb1) {
        failf(w, "depthB1 = ", t.depthB1, " must be stepN * stepKb * db = ", sb1, " or ", 2 * sb1);
    }
    if (t.isBias && uint64_t(t.baseN) * sbias > 1024) {
        failf(w, "baseN * sizeof(bias) = ", uint64_t(t.baseN) * sbias, " > BiasTable 1024 bytes");
    }
    const uint64_t l1 = uint64_t(t.depthA1) * t.baseM * t.baseK * sa + uint64_t(t.depthB1) * t.baseN * t.baseK * sb +
                        (t.isBias ? uint64_t(t.baseN) * sbias : 0);
    if (l1 > l1Free) {
        failf(w, "depthA1 * baseM * baseK * sizeof(A) + depthB1 * baseN * baseK * sizeof(B)",
              t.isBias ? " + baseN * sizeof(bias)" : "", " = ", l1, " > free L1 ", l1Free, " bytes");
    }
}

inline uint32_t tiling_l1_bytes(const AscendC::tiling::TCubeTiling& t, uint32_t sa, uint32_t sb, uint32_t sbias)
{
    return static_cast<uint32_t>(uint64_t(t.depthA1) * t.baseM * t.baseK * sa +
                                 uint64_t(t.depthB1) * t.baseN * t.baseK * sb + (t.isBias ? uint64_t(t.baseN) * sbias : 0));
}

/* Declared by REGIST_MATMUL_OBJ in the AIV's scope: leaving that scope ends the AIC's service. */
struct MatmulClientScope {
    bool active = false;
    MatmulClientScope() = default;
    MatmulClientScope(const MatmulClientScope&) = delete;
    ~MatmulClientScope()
    {
        if (active) matmul_client_quit();
    }
};

template <class T>
constexpr bool mm_input_type()
{
    return std::is_same_v<T, half> || std::is_same_v<T, bfloat16_t> || std::is_same_v<T, float>;
}

inline void regist_args(CoreCtx&, AscendC::TPipe*) {}

template <class MM, class... Rest>
void regist_args(CoreCtx& c, AscendC::TPipe* pipe, MM& mm, Rest&&... rest);

template <class MM, class First, class... Rest>
void regist_pair(CoreCtx& c, AscendC::TPipe* pipe, MM& mm, First&& first, Rest&&... rest)
{
    if constexpr (std::is_convertible_v<First, const AscendC::tiling::TCubeTiling*>) {
        mm.sim_register(c, pipe, static_cast<const AscendC::tiling::TCubeTiling*>(first));
        regist_args(c, pipe, std::forward<Rest>(rest)...);
    } else {
        mm.sim_register(c, pipe, nullptr); /* tiling given later with Init() */
        regist_args(c, pipe, std::forward<First>(first), std::forward<Rest>(rest)...);
    }
}

template <class MM, class... Rest>
void regist_args(CoreCtx& c, AscendC::TPipe* pipe, MM& mm, Rest&&... rest)
{
    if constexpr (sizeof...(Rest) == 0) {
        mm.sim_register(c, pipe, nullptr);
    } else {
        regist_pair(c, pipe, mm, std::forward<Rest>(rest)...);
    }
}

/* Returns true on the AIC after it served its AIVs (the macro then returns). */
template <class... Args>
bool regist_matmul(MatmulClientScope& scope, AscendC::TPipe* pipe, const void* workspace, Args&&... objs)
{
    CoreCtx& c = core();
    if (!ktype_is_mix_matmul(c.ktype)) {
        failf("REGIST_MATMUL_OBJ in a ", ktype_name(c.ktype),
              " kernel: Matmul MIX mode needs KERNEL_TYPE_MIX_AIC_1_2 or KERNEL_TYPE_MIX_AIC_1_1 "
              "(ASCENDC_CUBE_ONLY is not emulated)");
    }
    uintptr_t b = 0, e = 0;
    if (workspace == nullptr || !device_range(workspace, ASCEND_SIM_SYS_WORKSPACE, &b, &e)) {
        failf("REGIST_MATMUL_OBJ: the system workspace ", Hex{reinterpret_cast<uintptr_t>(workspace)},
              " is not a device allocation of at least GetLibApiWorkSpaceSize() = ", ASCEND_SIM_SYS_WORKSPACE,
              " bytes (pass GetSysWorkSpacePtr(), mark the kernel's workspace parameter __kfc_workspace__ and "
              "allocate system + user workspace on the host)");
    }
    if (pipe != nullptr && pipe->initCount_ > 0) {
        failf("REGIST_MATMUL_OBJ after TPipe::InitBuffer: in split mode it must come before any InitBuffer "
              "(section 1.4)");
    }
    c.mmObjects = 0;
    regist_args(c, pipe, std::forward<Args>(objs)...);
    if (c.mmObjects > kMaxMatmulObjects) {
        failf("REGIST_MATMUL_OBJ: ", c.mmObjects, " Matmul objects, at most ", kMaxMatmulObjects);
    }
    if (c.aic) {
        matmul_serve();
        return true;
    }
    c.mmQuit = false;
    scope.active = true;
    return false;
}

/* Computation on the AIC: C(i, j) = sum_k A(i, k) B(k, j) (+ bias(j)), fp32 accumulation. */
struct MatmulJob {
    const uint8_t* a;
    const uint8_t* b;
    const uint8_t* bias;
    uint8_t* c;
    int64_t m, n, k;
    int64_t lda, ldb, ldc; /* row strides in elements of the stored matrices */
    bool transA, transB;
    int atomic;
};

template <class AT, class BT, class CT, class BiasT>
void matmul_compute(const MatmulJob& j)
{
    std::vector<float> row(static_cast<size_t>(j.n));
    for (int64_t i = 0; i < j.m; ++i) {
        for (int64_t x = 0; x < j.n; ++x) {
            row[x] = j.bias ? static_cast<float>(to_num(ld<BiasT>(j.bias + x * sizeof(BiasT)))) : 0.0f;
        }
        for (int64_t kk = 0; kk < j.k; ++kk) {
            const int64_t ai = j.transA ? kk * j.lda + i : i * j.lda + kk;
            const float av = static_cast<float>(to_num(ld<AT>(j.a + ai * sizeof(AT))));
            for (int64_t x = 0; x < j.n; ++x) {
                const int64_t bi = j.transB ? x * j.ldb + kk : kk * j.ldb + x;
                row[x] += av * static_cast<float>(to_num(ld<BT>(j.b + bi * sizeof(BT))));
            }
        }
        uint8_t* crow = j.c + i * j.ldc * sizeof(CT);
        for (int64_t x = 0; x < j.n; ++x) {
            uint8_t* p = crow + x * sizeof(CT);
            if (j.atomic) st<CT>(p, from_num<CT>(to_num(ld<CT>(p)) + row[x]));
            else st<CT>(p, from_num<CT>(row[x]));
        }
    }
}

} // namespace ascend_sim

#define ASCEND_SIM_MM_SCOPE_NAME2(l) ascendSimMatmulClient##l
#define ASCEND_SIM_MM_SCOPE_NAME(l) ASCEND_SIM_MM_SCOPE_NAME2(l)
/* REGIST_MATMUL_OBJ(&pipe, GetSysWorkSpacePtr(), mm, &tiling [, mm2, &tiling2 ...]) */
#define REGIST_MATMUL_OBJ(tpipe, workspace, ...)                                                                \
    ::ascend_sim::MatmulClientScope ASCEND_SIM_MM_SCOPE_NAME(__LINE__);                                          \
    if (!::ascend_sim::regist_matmul(ASCEND_SIM_MM_SCOPE_NAME(__LINE__), (tpipe), (workspace), __VA_ARGS__)) { \
    } else                                                                                                      \
        return
#define REGIST_CUBE_OBJ REGIST_MATMUL_OBJ

namespace AscendC {

template <class A_TYPE, class B_TYPE, class C_TYPE, class BIAS_TYPE = C_TYPE, const auto& MM_CFG = CFG_NORM>
class Matmul {
public:
    using AT = typename A_TYPE::T;
    using BT = typename B_TYPE::T;
    using CT = typename C_TYPE::T;
    using BiasT = typename BIAS_TYPE::T;

    Matmul() = default;
    Matmul(const Matmul&) = delete;
    Matmul& operator=(const Matmul&) = delete;

    /* Tiling given after a REGIST_MATMUL_OBJ without one. */
    void Init(const tiling::TCubeTiling* cubeTiling, TPipe* tpipe = nullptr)
    {
        ascend_sim::CoreCtx& c = ascend_sim::core();
        if (!registered_) ascend_sim::failf("Matmul::Init before REGIST_MATMUL_OBJ");
        set_tiling(c, tpipe, cubeTiling);
    }

    void SetTensorA(const GlobalTensor<AT>& gm, bool isTransposeA = false)
    {
        client("SetTensorA");
        if (isTransposeA && !A_TYPE::isTrans) {
            ascend_sim::failf("Matmul::SetTensorA(..., true): transposed A requested but MatmulType A was declared "
                              "without ISTRANS = true");
        }
        a_ = gm;
        aSet_ = true;
        setSinceIterate_ = true;
        transA_ = isTransposeA;
    }
    void SetTensorB(const GlobalTensor<BT>& gm, bool isTransposeB = false)
    {
        client("SetTensorB");
        if (isTransposeB && !B_TYPE::isTrans) {
            ascend_sim::failf("Matmul::SetTensorB(..., true): transposed B requested but MatmulType B was declared "
                              "without ISTRANS = true");
        }
        b_ = gm;
        bSet_ = true;
        setSinceIterate_ = true;
        transB_ = isTransposeB;
    }
    void SetBias(const GlobalTensor<BiasT>& biasGlobal)
    {
        client("SetBias");
        if (!tiling_.isBias) {
            ascend_sim::failf("Matmul::SetBias but tiling.isBias = 0 (enable the bias in the host tiling)");
        }
        bias_ = biasGlobal;
        biasOn_ = true;
        setSinceIterate_ = true;
    }
    void DisableBias()
    {
        client("DisableBias");
        biasOn_ = false;
    }
    void ClearBias() { DisableBias(); }

    void SetOrgShape(int orgM, int orgN, int orgK) { SetOrgShape(orgM, orgN, orgK, orgK); }
    void SetOrgShape(int orgM, int orgN, int orgKa, int orgKb, int orgKc = 0)
    {
        client("SetOrgShape");
        if (orgM <= 0 || orgN <= 0 || orgKa <= 0 || orgKb <= 0 || orgKc < 0) {
            ascend_sim::failf("Matmul::SetOrgShape(", orgM, ", ", orgN, ", ", orgKa, ", ", orgKb, ", ", orgKc, "): sizes must be > 0 (orgKc >= 0)");
        }
        /* SetOrgShape.md, constraints: call it before SetTensorA/B, SetBias and SetSingleShape. */
        if (setSinceIterate_) {
            ascend_sim::failf("Matmul::SetOrgShape after SetTensorA/SetTensorB/SetBias/SetSingleShape: the documented order is SetOrgShape first");
        }
        orgM_ = orgM;
        orgN_ = orgN;
        orgKa_ = orgKa;
        orgKb_ = orgKb;
        /* orgKc: the N of C when it differs from B's N (0 = B's N; SetOrgShape.md). */
        orgKc_ = orgKc;
    }

    /* The single-core shape must not exceed the tiling's singleCoreM/N/K (section 3.2). */
    void SetSingleShape(int singleM, int singleN, int singleK)
    {
        client("SetSingleShape");
        single(singleM, singleN, singleK, "SetSingleShape");
        setSinceIterate_ = true;
    }
    void SetTail(int tailM = -1, int tailN = -1, int tailK = -1)
    {
        client("SetTail");
        single(tailM < 0 ? m_ : tailM, tailN < 0 ? n_ : tailN, tailK < 0 ? k_ : tailK, "SetTail");
    }

    /* Whole singleCoreM x singleCoreN block of C into GM; enAtomic = 1 accumulates into C. */
    template <bool sync = true>
    void IterateAll(const GlobalTensor<CT>& gm, uint8_t enAtomic = 0, bool enSequentialWrite = false,
                    bool waitIterateAll = false, bool fakeMsg = false)
    {
        using namespace ascend_sim;
        (void)enSequentialWrite;
        (void)waitIterateAll;
        (void)fakeMsg;
        const char* api = "Matmul::IterateAll";
        client("IterateAll");
        if (!aSet_ || !bSet_) failf(api, " before SetTensorA / SetTensorB");
        if (enAtomic > 1) failf(api, ": enAtomic = ", int(enAtomic), " (only 0 and 1 are emulated)");
        MatmulJob j{};
        j.m = m_;
        j.n = n_;
        j.k = k_;
        j.transA = transA_;
        j.transB = transB_;
        j.atomic = enAtomic;
        /* strides of the stored (ND) matrices, from the org shape */
        j.lda = transA_ ? orgM_ : orgKa_;
        j.ldb = transB_ ? orgKb_ : orgN_;
        j.ldc = orgKc_ > 0 ? orgKc_ : orgN_;
        if (!transA_ && j.k > orgKa_) failf(api, ": single k = ", j.k, " > org Ka = ", orgKa_, " (row stride of A)");
        if (transA_ && j.m > orgM_) failf(api, ": single m = ", j.m, " > org M = ", orgM_, " (row stride of A^T)");
        if (!transB_ && j.n > orgN_) failf(api, ": single n = ", j.n, " > org N = ", orgN_, " (row stride of B)");
        if (transB_ && j.k > orgKb_) failf(api, ": single k = ", j.k, " > org Kb = ", orgKb_, " (row stride of B^T)");
        if (j.n > j.ldc) failf(api, ": single n = ", j.n, " > the row stride of C = ", j.ldc, " (org Kc, or org N when Kc = 0)");
        const uint64_t aElems = transA_ ? (j.k - 1) * j.lda + j.m : (j.m - 1) * j.lda + j.k;
        const uint64_t bElems = transB_ ? (j.n - 1) * j.ldb + j.k : (j.k - 1) * j.ldb + j.n;
        const uint64_t cElems = (j.m - 1) * j.ldc + j.n;
        j.a = a_.check(0, aElems * sizeof(AT), "Matmul::IterateAll (tensor A)");
        j.b = b_.check(0, bElems * sizeof(BT), "Matmul::IterateAll (tensor B)");
        j.c = gm.check(0, cElems * sizeof(CT), "Matmul::IterateAll (tensor C)");
        j.bias = biasOn_ ? bias_.check(0, j.n * sizeof(BiasT), "Matmul::IterateAll (bias)") : nullptr;
        /* The next computation may start with SetOrgShape again. */
        setSinceIterate_ = false;
        /* Objects share the cube's L1 / L0C start address: one computes at a time, and switching to
         * another needs End() first (asc-devkit End.md; ops-transformer's flash attention ends bmm1
         * and bmm2 after each). */
        CoreCtx& self = core();
        if (self.mmHolding != nullptr && self.mmHolding != this) {
            failf("Matmul::IterateAll on a second Matmul object while another still holds the cube's L1 / L0C: "
                  "call End() on the first before switching objects");
        }
        self.mmHolding = this;
        matmul_call("IterateAll", [j] {
            if (j.atomic) gm_atomic_lock();
            matmul_compute<AT, BT, CT, BiasT>(j);
            if (j.atomic) gm_atomic_unlock();
        });
    }

    void End()
    {
        client("End");
        ascend_sim::CoreCtx& c = ascend_sim::core();
        if (c.mmHolding == this) c.mmHolding = nullptr;
    }

    /* ---- sim internals ---- */
    void sim_register(ascend_sim::CoreCtx& c, TPipe* pipe, const tiling::TCubeTiling* t)
    {
        using namespace ascend_sim;
        static_assert(mm_input_type<AT>() && mm_input_type<BT>(), "ascend-sim Matmul: A/B must be half, bfloat16_t or float");
        static_assert(std::is_same_v<AT, BT>, "ascend-sim Matmul: A and B must have the same element type");
        static_assert(std::is_same_v<CT, float> || std::is_same_v<CT, half> || std::is_same_v<CT, bfloat16_t>,
                      "ascend-sim Matmul: C must be float, half or bfloat16_t");
        static_assert(std::is_same_v<BiasT, float> || std::is_same_v<BiasT, half>,
                      "ascend-sim Matmul: the bias must be float or half");
        auto gmNd = [](TPosition p, CubeFormat f) { return p == TPosition::GM && f == CubeFormat::ND; };
        if (!gmNd(A_TYPE::pos, A_TYPE::format) || !gmNd(B_TYPE::pos, B_TYPE::format) ||
            !gmNd(C_TYPE::pos, C_TYPE::format)) {
            failf("REGIST_MATMUL_OBJ: only TPosition::GM / CubeFormat::ND operands are emulated");
        }
        ++c.mmObjects;
        registered_ = true;
        if (t != nullptr) set_tiling(c, pipe, t);
    }

private:
    void set_tiling(ascend_sim::CoreCtx& c, TPipe* pipe, const tiling::TCubeTiling* t)
    {
        using namespace ascend_sim;
        if (t == nullptr) failf("Matmul: null TCubeTiling");
        const uint32_t l1Free = mem_limit(Mem::L1) - (c.aic && pipe ? pipe->used(Mem::L1) : 0u);
        validate_tiling(*t, sizeof(AT), sizeof(BT), sizeof(BiasT), std::is_same_v<AT, float>, l1Free);
        if (c.aic && pipe != nullptr) {
            pipe->reserve_bytes(Mem::L1, tiling_l1_bytes(*t, sizeof(AT), sizeof(BT), sizeof(BiasT)),
                                "REGIST_MATMUL_OBJ (Matmul L1 buffers)");
        }
        tiling_ = *t;
        hasTiling_ = true;
        orgM_ = t->M;
        orgN_ = t->N;
        orgKa_ = t->Ka;
        orgKb_ = t->Kb;
        m_ = t->singleCoreM;
        n_ = t->singleCoreN;
        k_ = t->singleCoreK;
    }

    void client(const char* api) const
    {
        using namespace ascend_sim;
        CoreCtx& c = core();
        if (c.aic) {
            failf("Matmul::", api, " called on the AIC: in MIX mode only the AIVs issue Matmul calls "
                  "(the AIC serves them inside REGIST_MATMUL_OBJ)");
        }
        if (!ktype_is_mix_matmul(c.ktype)) {
            failf("Matmul::", api, " in a ", ktype_name(c.ktype),
                  " kernel: Matmul MIX mode needs KERNEL_TYPE_MIX_AIC_1_2 or KERNEL_TYPE_MIX_AIC_1_1");
        }
        if (!registered_) failf("Matmul::", api, " before REGIST_MATMUL_OBJ");
        if (!hasTiling_) failf("Matmul::", api, " without a tiling (pass &tiling to REGIST_MATMUL_OBJ or call Init)");
        if (c.mmQuit) {
            failf("Matmul::", api, " after the scope of REGIST_MATMUL_OBJ ended: the AIC has stopped serving "
                  "(hangs on hardware; put REGIST_MATMUL_OBJ in the kernel function itself)");
        }
    }

    void single(int m, int n, int k, const char* api)
    {
        using namespace ascend_sim;
        if (m <= 0 || n <= 0 || k <= 0) failf("Matmul::", api, "(", m, ", ", n, ", ", k, "): sizes must be > 0");
        if (m > tiling_.singleCoreM) failf("Matmul::", api, ": m = ", m, " > tiling.singleCoreM = ", tiling_.singleCoreM);
        if (n > tiling_.singleCoreN) failf("Matmul::", api, ": n = ", n, " > tiling.singleCoreN = ", tiling_.singleCoreN);
        if (k > tiling_.singleCoreK) failf("Matmul::", api, ": k = ", k, " > tiling.singleCoreK = ", tiling_.singleCoreK);
        m_ = m;
        n_ = n;
        k_ = k;
    }

    tiling::TCubeTiling tiling_{};
    bool registered_ = false, hasTiling_ = false;
    GlobalTensor<AT> a_;
    GlobalTensor<BT> b_;
    GlobalTensor<BiasT> bias_;
    bool aSet_ = false, bSet_ = false, transA_ = false, transB_ = false, biasOn_ = false;
    int orgM_ = 0, orgN_ = 0, orgKa_ = 0, orgKb_ = 0, orgKc_ = 0;
    /* SetTensorA/B, SetBias or SetSingleShape called since the last IterateAll. */
    bool setSinceIterate_ = false;
    int m_ = 0, n_ = 0, k_ = 0;
};

} // namespace AscendC

/* The samples use both spellings: AscendC::Matmul and matmul::Matmul. */
namespace matmul {
using AscendC::CFG_MDL;
using AscendC::CFG_NORM;
using AscendC::LayoutMode;
using AscendC::Matmul;
using AscendC::MatmulConfig;
using AscendC::MatmulType;
using ::CubeFormat;
} // namespace matmul

#endif // ASCEND_SIM_MATMUL_INTF_H
