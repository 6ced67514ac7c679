/*
 * ascend-sim: `#include "lib/matmul_intf.h"` as in the toolkit (docs/ascend-c.md 3.1).
 */
#ifndef ASCEND_SIM_LIB_MATMUL_INTF_H
#define ASCEND_SIM_LIB_MATMUL_INTF_H

#include "../adv_api/matmul/matmul_intf.h"

#endif // ASCEND_SIM_LIB_MATMUL_INTF_H
