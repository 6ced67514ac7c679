#!/bin/sh
# ascend-sim tests: the bisheng wrapper's command line and <<<>>> rewriting.
# Usage: sh tests/bisheng_cli.sh <ascend-sim dir>
set -u
SIM=$(cd "${1:-$(dirname "$0")/..}" && pwd)
BISHENG="$SIM/tools/bisheng_compiler/bin/bisheng"
CC=${CC:-gcc}
T=$(mktemp -d "${TMPDIR:-/tmp}/ascend-sim-cli.XXXXXX")
trap 'rm -rf "$T"' EXIT
cd "$T" || exit 1
export ASCEND_SIM_QUIET=1

pass=0
fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "  FAIL: $*"; }
# expect_grep <description> <file> <fixed string>
expect_grep() { if grep -qF -- "$3" "$2"; then ok; else bad "$1: '$3' not in output:"; sed 's/^/    /' "$2" | head -20; fi; }

# ---- kernels used below ----
cat > kern.asc <<'EOF'
#include "kernel_operator.h"
#include "acl/acl.h"
using namespace AscendC;

namespace ops {
/* a templated vector kernel: the type comes from the __vector__ qualifier */
template <typename T>
__global__ __vector__ void scale(GM_ADDR x, T s)
{
    GlobalTensor<T> g;
    g.SetGlobalBuffer((__gm__ T*)x, 8 * GetBlockNum());
    g.SetValue(GetBlockIdx(), g.GetValue(GetBlockIdx()) * s);
}
} // namespace ops

/* two kernels in one file: each carries its type; "<<<" in a string or comment is not a launch */
extern "C" __global__ __mix__(1, 2) void ratio(GM_ADDR out)
{
    const char* text = "k<<<1, 0, s>>>()"; // k<<<1, 0, s>>>()
    (void)text;
    GlobalTensor<int32_t> g;
    g.SetGlobalBuffer((__gm__ int32_t*)out, 64);
    if ASCEND_IS_AIV g.SetValue(GetBlockIdx(), static_cast<int32_t>(GetTaskRatio()));
}

extern "C" int run_kernels(void* stream)
{
    float* x = nullptr;
    int32_t* out = nullptr;
    aclrtMalloc((void**)&x, 64 * sizeof(float), ACL_MEM_MALLOC_HUGE_FIRST);
    aclrtMalloc((void**)&out, 64 * sizeof(int32_t), ACL_MEM_MALLOC_HUGE_FIRST);
    float h[64];
    for (int i = 0; i < 64; ++i) h[i] = 1.0f + i;
    aclrtMemcpy(x, sizeof h, h, sizeof h, ACL_MEMCPY_HOST_TO_DEVICE);
    ops::scale<float><<<4, nullptr,
                        stream>>>((uint8_t*)x, 2.0f);
    ratio<<<3, 0, stream>>>((uint8_t*)out);
    int rc = aclrtSynchronizeStream(stream);
    int32_t r[64];
    aclrtMemcpy(h, sizeof h, x, sizeof h, ACL_MEMCPY_DEVICE_TO_HOST);
    aclrtMemcpy(r, sizeof r, out, sizeof r, ACL_MEMCPY_DEVICE_TO_HOST);
    aclrtFree(x);
    aclrtFree(out);
    if (rc != 0) return rc;
    if (h[0] != 2.0f || h[3] != 8.0f || h[4] != 5.0f) return 100;
    if (r[0] != 2 || r[5] != 2) return 101;
    return 0;
}
EOF
cat > main.cpp <<'EOF'
#include "acl/acl.h"
#include <cstdio>
extern "C" int run_kernels(void* stream);
int main()
{
    aclInit(nullptr);
    aclrtSetDevice(0);
    aclrtStream s;
    aclrtCreateStream(&s);
    int rc = run_kernels(s);
    std::printf("run_kernels = %d, launches = %llu\n", rc, (unsigned long long)ascend_sim_launch_count());
    return rc;
}
EOF

# 1. new flow, one shot, with the flags CATLASS passes
if "$BISHENG" --npu-arch=dav-2201 -mllvm -cce-aicore-record-overflow=true -mllvm -cce-aicore-dcci-insert-for-scalar=false \
     -O2 -Wall -Wextra -Werror main.cpp kern.asc -o app >out.txt 2>&1 && ./app >run.txt 2>&1; then
    ok; expect_grep "one-shot build" run.txt "run_kernels = 0, launches = 2"
else bad "one-shot build"; cat out.txt run.txt; fi

# 2. legacy flow: -x cce --cce-aicore-arch, separate compile, --cce-fatobj-link
cp kern.asc kern.cce
if "$BISHENG" -x cce --cce-aicore-arch=dav-c220 --cce-aicore-only --cce-auto-sync -std=c++17 -O3 --cce-aicore-lang \
     -mllvm -cce-aicore-stack-size=0x8000 -fPIC -c kern.cce -o kern.o >out.txt 2>&1 &&
   "$BISHENG" -c main.cpp -o main.o >>out.txt 2>&1 &&
   "$BISHENG" --cce-fatobj-link kern.o main.o -o app2 >>out.txt 2>&1 && ./app2 >run.txt 2>&1; then ok; else bad "legacy flow"; cat out.txt run.txt; fi

# 3. static library (-lib) and shared library (-shared)
if "$BISHENG" -lib kern.asc -o libkern.a --npu-arch=dav-2201 >out.txt 2>&1 && ar t libkern.a >ar.txt 2>&1 &&
   "$BISHENG" main.cpp -L. -lkern -o app3 >>out.txt 2>&1 && ./app3 >run.txt 2>&1; then ok; else bad "-lib"; cat out.txt; fi
if "$BISHENG" --cce-build-static-lib -dc kern.asc -o libkern2.a >out.txt 2>&1 && [ -s libkern2.a ]; then ok; else bad "--cce-build-static-lib"; cat out.txt; fi
if "$BISHENG" -shared -fPIC kern.asc -o libkern.so --npu-arch=dav-2201 >out.txt 2>&1 &&
   "$BISHENG" main.cpp -L. -lkern -Wl,-rpath,"$T" -o app4 >>out.txt 2>&1 && ./app4 >run.txt 2>&1 &&
   nm -D libkern.so | grep -q " T run_kernels"; then ok; else bad "-shared"; cat out.txt run.txt; fi

# 4. -v prints the g++ commands with the sim flags; --sanitizer maps to ASan + UBSan
"$BISHENG" -v --sanitizer -c kern.asc -o k.o >out.txt 2>&1
expect_grep "-v" out.txt "-D__NPU_ARCH__=2201"
expect_grep "-v" out.txt "-I$SIM/asc/include"
expect_grep "--sanitizer" out.txt "-fsanitize=address,undefined"
"$BISHENG" -v main.cpp kern.asc -o app5 >out.txt 2>&1
expect_grep "-v link" out.txt "-lascendcl -Wl,-rpath,$SIM/lib64"

# 5. a kernel without a type is a compile error naming it, at the launch's line
cat > notype.asc <<'EOF'
#include "kernel_operator.h"
extern "C" __global__ __aicore__ void untyped(GM_ADDR x) { (void)x; }
void host(void* s)
{
    untyped<<<1, nullptr, s>>>(nullptr);
}
EOF
if "$BISHENG" -c notype.asc -o n.o >out.txt 2>&1; then bad "missing kernel type accepted"; else ok; fi
expect_grep "missing type" out.txt "notype.asc:5: error: ascend-sim bisheng: cannot determine the kernel type of 'untyped'"

# KERNEL_TASK_TYPE_DEFAULT gives the type only when the file defines a single kernel
cat > single.asc <<'EOF'
#include "kernel_operator.h"
extern "C" __global__ __aicore__ void only(GM_ADDR x) { KERNEL_TASK_TYPE_DEFAULT(KERNEL_TYPE_AIV_ONLY); (void)x; }
void host(void* s) { only<<<1, nullptr, s>>>(nullptr); }
EOF
if "$BISHENG" -c single.asc -o s.o >out.txt 2>&1; then ok; else bad "KERNEL_TASK_TYPE_DEFAULT in a one-kernel file rejected"; cat out.txt; fi
cat > several.asc <<'EOF'
#include "kernel_operator.h"
extern "C" __global__ __vector__ void first(GM_ADDR x) { (void)x; }
extern "C" __global__ __aicore__ void second(GM_ADDR x) { KERNEL_TASK_TYPE_DEFAULT(KERNEL_TYPE_AIV_ONLY); (void)x; }
void host(void* s) { first<<<1, nullptr, s>>>(nullptr); second<<<1, nullptr, s>>>(nullptr); }
EOF
if "$BISHENG" -c several.asc -o v.o >out.txt 2>&1; then bad "KERNEL_TASK_TYPE_DEFAULT accepted in a file of several kernels"; else
  expect_grep "several kernels" out.txt "defines several __global__ functions"; fi

cat > conflict.asc <<'EOF'
#include "kernel_operator.h"
extern "C" __global__ __vector__ void both(GM_ADDR x) { KERNEL_TASK_TYPE_DEFAULT(KERNEL_TYPE_MIX_AIC_1_2); (void)x; }
void host(void* s) { both<<<1, nullptr, s>>>(nullptr); }
EOF
if "$BISHENG" -c conflict.asc -o c.o >out.txt 2>&1; then bad "conflicting kernel types accepted"; else ok; fi
expect_grep "conflict" out.txt "kernel 'both': conflicting kernel types"

cat > nodef.asc <<'EOF'
#include "kernel_operator.h"
extern "C" __global__ __aicore__ void elsewhere(GM_ADDR x);
void host(void* s) { elsewhere<<<1, nullptr, s>>>(nullptr); }
EOF
if "$BISHENG" -c nodef.asc -o d.o >out.txt 2>&1; then bad "undefined kernel accepted"; else ok; fi
expect_grep "no definition" out.txt "no __global__ definition of it in this file"

# 6. compiler errors point at the original file and line (#line)
cat > lineerr.asc <<'EOF'
#include "kernel_operator.h"
extern "C" __global__ __mix__(1, 2) void k(GM_ADDR x) { (void)x; }
void host(void* s)
{
    k<<<1,
        nullptr, s>>>(nullptr);
    int y = undefined_symbol_here;
}
EOF
"$BISHENG" -c lineerr.asc -o l.o >out.txt 2>&1
expect_grep "#line" out.txt "lineerr.asc:7:"
expect_grep "#line" out.txt "undefined_symbol_here"

# 7. --cce-auto-sync=off: scalar <-> vector accesses need explicit flags
cat > autosync.asc <<'EOF'
#include "kernel_operator.h"
#include "acl/acl.h"
#include <cstdio>
#include <cstring>
using namespace AscendC;
__global__ __vector__ void k()
{
    TPipe pipe;
    TBuf<> b;
    pipe.InitBuffer(b, 256);
    LocalTensor<float> t = b.Get<float>();
    t.SetValue(0, 1.0f);
    Adds(t, t, 1.0f, 8);
}
int main()
{
    aclInit(nullptr);
    aclrtSetDevice(0);
    k<<<1, nullptr, nullptr>>>();
    int rc = aclrtSynchronizeStream(nullptr);
    const char* m = aclGetRecentErrMsg();
    std::printf("rc=%d %s\n", rc, m ? m : "ok");
    return 0;
}
EOF
"$BISHENG" autosync.asc -o as_on >out.txt 2>&1 && ./as_on >run.txt 2>&1
expect_grep "auto-sync on" run.txt "rc=0 ok"
"$BISHENG" --cce-auto-sync=off autosync.asc -o as_off >out.txt 2>&1 && ./as_off >run.txt 2>&1
expect_grep "auto-sync off" run.txt "buffer written by S read by V without synchronisation"

# 8. --cce-disable-asc-reserved-ubuf frees the 8 KB reserve
cat > ubuf.asc <<'EOF'
#include "kernel_operator.h"
#include "acl/acl.h"
#include <cstdio>
using namespace AscendC;
__global__ __vector__ void k()
{
    TPipe pipe;
    TBuf<> b;
    pipe.InitBuffer(b, 196352);
}
int main()
{
    aclInit(nullptr);
    aclrtSetDevice(0);
    k<<<1, nullptr, nullptr>>>();
    std::printf("rc=%d\n", aclrtSynchronizeStream(nullptr));
    return 0;
}
EOF
"$BISHENG" ubuf.asc -o ub1 >out.txt 2>&1 && ./ub1 >run.txt 2>&1
expect_grep "UB reserve" run.txt "rc=507015"
"$BISHENG" --cce-disable-asc-reserved-ubuf ubuf.asc -o ub2 >out.txt 2>&1 && ./ub2 >run.txt 2>&1
expect_grep "UB reserve disabled" run.txt "rc=0"

# 9. bad input, version
if "$BISHENG" -c foo.unknown >out.txt 2>&1; then bad "unknown input accepted"; else ok; fi
expect_grep "unknown input" out.txt "unrecognised input file foo.unknown"
"$BISHENG" --version >out.txt 2>&1
expect_grep "--version" out.txt "bisheng (ascend-sim)"

# 9b. ASCEND_SIM_OPT replaces the command's optimisation flags; a value that is not one is refused
ASCEND_SIM_OPT=-O0 "$BISHENG" -v -O2 -c kern.asc -o k.o >out.txt 2>&1
if grep -q -- " -O2" out.txt; then bad "ASCEND_SIM_OPT=-O0 kept -O2"; else ok; fi
expect_grep "ASCEND_SIM_OPT" out.txt " -O0"
if ASCEND_SIM_OPT=fast "$BISHENG" -c kern.asc -o k.o >out.txt 2>&1; then bad "ASCEND_SIM_OPT=fast accepted"; else ok; fi
expect_grep "bad ASCEND_SIM_OPT" out.txt "ASCEND_SIM_OPT=fast is not an optimisation flag"

# 10. the AscendCL headers are C headers too (and C++ for bindgen)
printf '#include "acl/acl.h"\nint main(void) { aclrtStream s = 0; (void)s; return ACL_ERROR_RT_AICORE_EXCEPTION == 507015 ? 0 : 1; }\n' > c_api.c
if $CC -std=c99 -Wall -Wextra -Werror -pedantic -I"$SIM/include" -c c_api.c -o c_api.o >out.txt 2>&1; then ok; else bad "acl.h as C"; cat out.txt; fi
if g++ -x c++ -std=c++14 -Wall -Wextra -Werror -I"$SIM/include" -fsyntax-only c_api.c >out.txt 2>&1; then ok; else bad "acl.h as C++14"; cat out.txt; fi

echo "bisheng_cli: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
