/*
 * ascend-sim tests: the AscendCL runtime subset (docs/ascend-c.md section 6): error codes before
 * aclInit and without a device, device-pointer checks of aclrtMemcpy / aclrtMemset / aclrtFree,
 * streams, capabilities, the thread-local error message.
 */
#include "acl/acl.h"
#include "sim_test.h"

#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

static bool msg_has(const char* needle)
{
    const char* m = aclGetRecentErrMsg();
    return m != nullptr && std::strstr(m, needle) != nullptr;
}

#define EXPECT_RC(expr, code)                                                                           \
    do {                                                                                                \
        const aclError rc_ = (expr);                                                                    \
        if (rc_ != (code)) {                                                                            \
            const char* m_ = aclGetRecentErrMsg();                                                      \
            std::printf("  FAIL %s:%d: %s = %d, want %d (%s)\n", __FILE__, __LINE__, #expr, rc_, (code), m_ ? m_ : ""); \
            ++simtest::failures();                                                                      \
        } else {                                                                                        \
            ++simtest::passes();                                                                        \
        }                                                                                               \
    } while (0)

int main()
{
    setenv("ASCEND_SIM_QUIET", "1", 1);
    uint32_t count = 0;
    void* p = nullptr;
    int32_t dev = -1;

    /* before aclInit */
    SIM_CHECK(aclGetRecentErrMsg() == nullptr, "no message yet");
    EXPECT_RC(aclrtGetDeviceCount(&count), ACL_ERROR_UNINITIALIZE);
    EXPECT_RC(aclrtSetDevice(0), ACL_ERROR_UNINITIALIZE);
    EXPECT_RC(aclrtMalloc(&p, 16, ACL_MEM_MALLOC_HUGE_FIRST), ACL_ERROR_UNINITIALIZE);
    SIM_CHECK(msg_has("aclrtMalloc: aclInit has not been called"), "%s", aclGetRecentErrMsg());
    EXPECT_RC(aclFinalize(), ACL_ERROR_UNINITIALIZE);
    int32_t major = 0, minor = 0, patch = 0;
    EXPECT_RC(aclrtGetVersion(&major, &minor, &patch), ACL_SUCCESS);
    SIM_CHECK(major >= 1, "version %d.%d.%d", major, minor, patch);

    EXPECT_RC(aclInit(nullptr), ACL_SUCCESS);
    EXPECT_RC(aclInit(nullptr), ACL_ERROR_REPEAT_INITIALIZE);

    /* without a device on this thread */
    EXPECT_RC(aclrtMalloc(&p, 16, ACL_MEM_MALLOC_HUGE_FIRST), ACL_ERROR_RT_CONTEXT_NULL);
    SIM_CHECK(msg_has("no device set on this thread"), "%s", aclGetRecentErrMsg());
    aclrtStream s = nullptr;
    EXPECT_RC(aclrtCreateStream(&s), ACL_ERROR_RT_CONTEXT_NULL);
    EXPECT_RC(aclrtGetDevice(&dev), ACL_ERROR_RT_CONTEXT_NULL);
    EXPECT_RC(aclrtGetDeviceCount(&count), ACL_SUCCESS);
    SIM_CHECK(count == 1, "device count %u", count);
    EXPECT_RC(aclrtSetDevice(1), ACL_ERROR_RT_INVALID_DEVICEID);
    EXPECT_RC(aclrtSetDevice(0), ACL_SUCCESS);
    EXPECT_RC(aclrtGetDevice(&dev), ACL_SUCCESS);
    SIM_CHECK(dev == 0, "device %d", dev);

    /* capabilities (Ascend910B2) */
    int64_t v = 0;
    EXPECT_RC(aclGetDeviceCapability(0, ACL_DEVICE_INFO_AI_CORE_NUM, &v), ACL_SUCCESS);
    SIM_CHECK(v == 24, "AI cores %lld", (long long)v);
    EXPECT_RC(aclGetDeviceCapability(0, ACL_DEVICE_INFO_VECTOR_CORE_NUM, &v), ACL_SUCCESS);
    SIM_CHECK(v == 48, "vector cores %lld", (long long)v);
    EXPECT_RC(aclGetDeviceCapability(0, ACL_DEVICE_INFO_L2_SIZE, &v), ACL_SUCCESS);
    SIM_CHECK(v == 192ll * 1024 * 1024, "L2 %lld", (long long)v);
    EXPECT_RC(aclGetDeviceCapability(1, ACL_DEVICE_INFO_AI_CORE_NUM, &v), ACL_ERROR_RT_INVALID_DEVICEID);
    EXPECT_RC(aclGetDeviceCapability(0, static_cast<aclDeviceInfo>(7), &v), ACL_ERROR_INVALID_PARAM);
    SIM_CHECK(std::strcmp(aclrtGetSocName(), "Ascend910B2") == 0, "soc %s", aclrtGetSocName());

    /* memory */
    EXPECT_RC(aclrtMalloc(&p, 0, ACL_MEM_MALLOC_HUGE_FIRST), ACL_ERROR_INVALID_PARAM);
    EXPECT_RC(aclrtMalloc(&p, 100, ACL_MEM_MALLOC_HUGE_FIRST), ACL_SUCCESS);
    void* q = nullptr;
    EXPECT_RC(aclrtMalloc(&q, 100, ACL_MEM_MALLOC_NORMAL_ONLY), ACL_SUCCESS);
    char host[128];
    std::memset(host, 7, sizeof host);
    EXPECT_RC(aclrtMemcpy(p, 100, host, 100, ACL_MEMCPY_HOST_TO_DEVICE), ACL_SUCCESS);
    EXPECT_RC(aclrtMemcpy(p, 100, host, 101, ACL_MEMCPY_HOST_TO_DEVICE), ACL_ERROR_INVALID_PARAM);
    SIM_CHECK(msg_has("count 101 > destMax 100"), "%s", aclGetRecentErrMsg());
    EXPECT_RC(aclrtMemcpy(p, 128, host, 101, ACL_MEMCPY_HOST_TO_DEVICE), ACL_ERROR_INVALID_PARAM);
    SIM_CHECK(msg_has("dst ["), "%s", aclGetRecentErrMsg());
    SIM_CHECK(msg_has("is not inside a device allocation"), "%s", aclGetRecentErrMsg());
    EXPECT_RC(aclrtMemcpy(host, 128, host + 64, 16, ACL_MEMCPY_HOST_TO_DEVICE), ACL_ERROR_INVALID_PARAM);
    EXPECT_RC(aclrtMemcpy(p, 100, q, 16, ACL_MEMCPY_HOST_TO_DEVICE), ACL_ERROR_INVALID_PARAM);
    SIM_CHECK(msg_has("is device memory but the copy kind 1 says host"), "%s", aclGetRecentErrMsg());
    EXPECT_RC(aclrtMemcpy(host, 128, host + 64, 16, ACL_MEMCPY_DEVICE_TO_HOST), ACL_ERROR_INVALID_PARAM);
    EXPECT_RC(aclrtMemcpy(q, 100, p, 100, ACL_MEMCPY_DEVICE_TO_DEVICE), ACL_SUCCESS);
    EXPECT_RC(aclrtMemset(q, 100, 3, 50), ACL_SUCCESS);
    EXPECT_RC(aclrtMemset(q, 100, 3, 101), ACL_ERROR_INVALID_PARAM);
    EXPECT_RC(aclrtMemset(q, 200, 3, 101), ACL_ERROR_INVALID_PARAM);
    std::memset(host, 0, sizeof host);
    EXPECT_RC(aclrtMemcpy(host, 128, q, 100, ACL_MEMCPY_DEFAULT), ACL_SUCCESS);
    SIM_CHECK(host[0] == 3 && host[49] == 3 && host[50] == 7 && host[99] == 7, "%d %d %d", host[0], host[50], host[99]);
    EXPECT_RC(aclrtFree(static_cast<char*>(p) + 4), ACL_ERROR_INVALID_PARAM);
    EXPECT_RC(aclrtFree(p), ACL_SUCCESS);
    EXPECT_RC(aclrtFree(p), ACL_ERROR_INVALID_PARAM);
    EXPECT_RC(aclrtMemcpy(host, 128, p, 16, ACL_MEMCPY_DEVICE_TO_HOST), ACL_ERROR_INVALID_PARAM); /* freed */
    void* h = nullptr;
    EXPECT_RC(aclrtMallocHost(&h, 64), ACL_SUCCESS);
    EXPECT_RC(aclrtMemcpy(h, 64, q, 64, ACL_MEMCPY_DEVICE_TO_HOST), ACL_SUCCESS);
    EXPECT_RC(aclrtFreeHost(q), ACL_ERROR_INVALID_PARAM);
    EXPECT_RC(aclrtFreeHost(h), ACL_SUCCESS);
    EXPECT_RC(aclrtFree(q), ACL_SUCCESS);

    /* streams */
    EXPECT_RC(aclrtCreateStream(&s), ACL_SUCCESS);
    EXPECT_RC(aclrtSynchronizeStream(s), ACL_SUCCESS);
    EXPECT_RC(aclrtSynchronizeStream(nullptr), ACL_SUCCESS);
    EXPECT_RC(aclrtSynchronizeDevice(), ACL_SUCCESS);
    EXPECT_RC(aclrtDestroyStream(s), ACL_SUCCESS);
    EXPECT_RC(aclrtDestroyStream(s), ACL_ERROR_INVALID_PARAM);
    EXPECT_RC(aclrtSynchronizeStream(s), ACL_ERROR_INVALID_PARAM);

    /* other threads: own device binding, own error message */
    std::thread([] {
        void* t = nullptr;
        SIM_CHECK(aclGetRecentErrMsg() == nullptr, "the message is per thread");
        const aclError rc = aclrtMalloc(&t, 16, ACL_MEM_MALLOC_HUGE_FIRST);
        SIM_CHECK(rc == ACL_ERROR_RT_CONTEXT_NULL, "rc %d", rc);
        SIM_CHECK(aclrtSetDevice(0) == ACL_SUCCESS && aclrtMalloc(&t, 16, ACL_MEM_MALLOC_HUGE_FIRST) == ACL_SUCCESS &&
                      aclrtFree(t) == ACL_SUCCESS,
                  "second thread");
    }).join();

    /* fp16 helpers */
    SIM_CHECK(aclFloatToFloat16(1.0f) == 0x3c00 && aclFloat16ToFloat(0xc000) == -2.0f &&
                  aclFloatToFloat16(65520.0f) == 0x7c00,
              "fp16 helpers");
    SIM_CHECK(ascend_sim_launch_count() == 0, "no launches in this program");

    EXPECT_RC(aclrtResetDevice(0), ACL_SUCCESS);
    EXPECT_RC(aclrtMalloc(&p, 16, ACL_MEM_MALLOC_HUGE_FIRST), ACL_ERROR_RT_CONTEXT_NULL);
    EXPECT_RC(aclFinalize(), ACL_SUCCESS);
    EXPECT_RC(aclFinalize(), ACL_ERROR_REPEAT_FINALIZE);
    EXPECT_RC(aclInit(nullptr), ACL_ERROR_REPEAT_INITIALIZE);
    EXPECT_RC(aclrtGetDeviceCount(&count), ACL_ERROR_UNINITIALIZE);

    std::printf("acl_api: %d passed, %d failed\n", simtest::passes(), simtest::failures());
    return simtest::failures() == 0 ? 0 : 1;
}
