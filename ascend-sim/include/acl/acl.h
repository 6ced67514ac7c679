/*
 * ascend-sim: AscendCL entry header (subset). Includes acl_rt.h like the real acl.h.
 */
#ifndef ASCEND_SIM_ACL_H_
#define ASCEND_SIM_ACL_H_

#include "acl_rt.h"

#ifdef __cplusplus
extern "C" {
#endif

#define ACL_MAJOR_VERSION 1
#define ACL_MINOR_VERSION 0
#define ACL_PATCH_VERSION 0

ACL_FUNC_VISIBILITY aclError aclInit(const char *configPath);
ACL_FUNC_VISIBILITY aclError aclFinalize(void);
/* Last error message of the calling thread, NULL when there is none. */
ACL_FUNC_VISIBILITY const char *aclGetRecentErrMsg(void);
ACL_FUNC_VISIBILITY aclError aclrtGetVersion(int32_t *majorVersion, int32_t *minorVersion,
                                             int32_t *patchVersion);

#ifdef __cplusplus
}
#endif

#endif /* ASCEND_SIM_ACL_H_ */
