/*
 * ascend-sim tests: a tiny harness shared by the test programs.
 *
 * Each case launches a kernel through the rewritten `<<<>>>` syntax, synchronises the stream and
 * checks either success or the exact error code plus a substring of the error message.
 */
#ifndef ASCEND_SIM_TEST_H
#define ASCEND_SIM_TEST_H

#include "acl/acl.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace simtest {

inline int& failures()
{
    static int n = 0;
    return n;
}
inline int& passes()
{
    static int n = 0;
    return n;
}
inline aclrtStream& stream()
{
    static aclrtStream s = nullptr;
    return s;
}

#define SIM_CHECK(cond, ...)                                                   \
    do {                                                                       \
        if (!(cond)) {                                                         \
            std::printf("  CHECK FAILED %s:%d: %s: ", __FILE__, __LINE__, #cond); \
            std::printf(__VA_ARGS__);                                          \
            std::printf("\n");                                                 \
            ++::simtest::failures();                                           \
        }                                                                      \
    } while (0)

#define ACL_OK(expr)                                                                              \
    do {                                                                                          \
        aclError e_ = (expr);                                                                     \
        if (e_ != ACL_SUCCESS) {                                                                  \
            const char* m_ = aclGetRecentErrMsg();                                                \
            std::printf("  ACL FAILED %s:%d: %s = %d (%s)\n", __FILE__, __LINE__, #expr, e_, m_ ? m_ : ""); \
            std::exit(2);                                                                         \
        }                                                                                         \
    } while (0)

/* Quiet stderr, short deadlock timeout (unless the test wants the default), ACL up. */
inline void init(bool defaultDeadlock = false)
{
    setenv("ASCEND_SIM_QUIET", "1", 1);
    if (!defaultDeadlock) setenv("ASCEND_SIM_DEADLOCK_MS", "300", 1);
    ACL_OK(aclInit(nullptr));
    ACL_OK(aclrtSetDevice(0));
    ACL_OK(aclrtCreateStream(&stream()));
}

inline int finish(const char* suite)
{
    ACL_OK(aclrtDestroyStream(stream()));
    ACL_OK(aclrtResetDevice(0));
    ACL_OK(aclFinalize());
    std::printf("%s: %d passed, %d failed\n", suite, passes(), failures());
    return failures() == 0 ? 0 : 1;
}

/* Device buffer with host mirror. */
template <class T>
struct DevBuf {
    std::vector<T> host;
    void* dev = nullptr;
    explicit DevBuf(size_t n, T fill = T()) : host(n, fill)
    {
        ACL_OK(aclrtMalloc(&dev, n * sizeof(T) == 0 ? 1 : n * sizeof(T), ACL_MEM_MALLOC_HUGE_FIRST));
        upload();
    }
    DevBuf(const DevBuf&) = delete;
    ~DevBuf() { aclrtFree(dev); }
    void upload() { ACL_OK(aclrtMemcpy(dev, bytes(), host.data(), bytes(), ACL_MEMCPY_HOST_TO_DEVICE)); }
    void download() { ACL_OK(aclrtMemcpy(host.data(), bytes(), dev, bytes(), ACL_MEMCPY_DEVICE_TO_HOST)); }
    size_t bytes() const { return host.size() * sizeof(T); }
    uint8_t* gm() const { return static_cast<uint8_t*>(dev); }
    T& operator[](size_t i) { return host[i]; }
};

/* Synchronises and expects success. */
inline bool expect_ok(const char* name)
{
    const aclError rc = aclrtSynchronizeStream(stream());
    if (rc != ACL_SUCCESS) {
        const char* m = aclGetRecentErrMsg();
        std::printf("  FAIL %s: expected success, got %d: %s\n", name, rc, m ? m : "(no message)");
        ++failures();
        return false;
    }
    ++passes();
    return true;
}

/* Synchronises and expects `code` with `needle` in the error message. */
inline bool expect_error(const char* name, const char* needle, aclError code = ACL_ERROR_RT_AICORE_EXCEPTION)
{
    const aclError rc = aclrtSynchronizeStream(stream());
    const char* m = aclGetRecentErrMsg();
    const std::string msg = m ? m : "";
    if (rc != code || msg.find(needle) == std::string::npos) {
        std::printf("  FAIL %s: expected error %d containing \"%s\", got %d: %s\n", name, code, needle, rc,
                    msg.empty() ? "(no message)" : msg.c_str());
        ++failures();
        return false;
    }
    ++passes();
    return true;
}

inline bool near(double a, double b, double tol) { return std::fabs(a - b) <= tol * (1.0 + std::fabs(b)); }

} // namespace simtest

#endif // ASCEND_SIM_TEST_H
