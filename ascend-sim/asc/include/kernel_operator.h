/*
 * ascend-sim: host implementation of the Ascend C subset used by autofusion
 * (docs/ascend-c.md sections 1, 2, 3 and the checklist of section 11).
 *
 * Kernels written for Atlas A2 (arch 2201) compile unchanged with the host g++ through the
 * ascend-sim `bisheng` wrapper and run one std::thread per logical core, with the invariants of
 * section 11.8 checked at every call. See ascend-sim/README.md.
 */
#ifndef ASCEND_SIM_KERNEL_OPERATOR_H
#define ASCEND_SIM_KERNEL_OPERATOR_H

#include "basic_api/sim_types.h"
#include "basic_api/sim_core.h"
#include "basic_api/kernel_tensor.h"
#include "basic_api/kernel_tpipe.h"
#include "basic_api/kernel_operator_sync_intf.h"
#include "basic_api/kernel_operator_data_copy_intf.h"
#include "basic_api/kernel_operator_vec_intf.h"
#include "basic_api/sim_launch.h"

#endif // ASCEND_SIM_KERNEL_OPERATOR_H
