/*
 * ascend-sim: TCubeTiling, the Matmul tiling handed from the host to the kernel
 * (docs/ascend-c.md 3.2). Plain C++ POD with the 50 int32 fields of the toolkit's
 * TCubeTiling, in the toolkit's order (asc-devkit include/adv_api/matmul/matmul_tilingdata.h;
 * field meanings in ADV/矩阵计算/Matmul-Tiling类/TCubeTiling结构体.md). Usable from host code
 * without kernel_operator.h.
 */
#ifndef ASCEND_SIM_TCUBE_TILING_H
#define ASCEND_SIM_TCUBE_TILING_H

#include <stdint.h>

namespace AscendC {
namespace tiling {

struct TCubeTiling {
    int32_t usedCoreNum;
    int32_t M;
    int32_t N;
    int32_t Ka;
    int32_t Kb;
    int32_t singleCoreM;
    int32_t singleCoreN;
    int32_t singleCoreK;
    int32_t baseM;
    int32_t baseN;
    int32_t baseK;
    int32_t depthA1;
    int32_t depthB1;
    int32_t stepM;
    int32_t stepN;
    int32_t isBias;
    int32_t transLength;
    int32_t iterateOrder;
    int32_t shareMode;
    int32_t shareL1Size;
    int32_t shareL0CSize;
    int32_t shareUbSize;
    int32_t batchM;
    int32_t batchN;
    int32_t singleBatchM;
    int32_t singleBatchN;
    int32_t stepKa;
    int32_t stepKb;
    int32_t depthAL1CacheUB;
    int32_t depthBL1CacheUB;
    int32_t dbL0A;
    int32_t dbL0B;
    int32_t dbL0C;
    int32_t ALayoutInfoB;
    int32_t ALayoutInfoS;
    int32_t ALayoutInfoN;
    int32_t ALayoutInfoG;
    int32_t ALayoutInfoD;
    int32_t BLayoutInfoB;
    int32_t BLayoutInfoS;
    int32_t BLayoutInfoN;
    int32_t BLayoutInfoG;
    int32_t BLayoutInfoD;
    int32_t CLayoutInfoB;
    int32_t CLayoutInfoS1;
    int32_t CLayoutInfoN;
    int32_t CLayoutInfoG;
    int32_t CLayoutInfoS2;
    int32_t BatchNum;
    int32_t mxTypePara;
};

static_assert(sizeof(TCubeTiling) == 50 * sizeof(int32_t), "TCubeTiling is 50 packed int32 fields");

} // namespace tiling
} // namespace AscendC

/* Also reachable unqualified, as in the toolkit's samples. */
using TCubeTiling = AscendC::tiling::TCubeTiling;

#endif // ASCEND_SIM_TCUBE_TILING_H
