/* The floor of host launch cost on this machine: cuLaunchKernel called from C in a loop.
 *
 *     cc -O2 -o bench_launch samples/bench_launch.c -ldl
 *     ./bench_launch kernel.cubin kernel_name [launches]
 *
 * The kernel takes (a 128-byte tensor map by value, a pointer, a u32), like the Python
 * launches it is compared with. Every launch is timed on its own and the queue is drained
 * every 50 launches, as ptxdsl.runtime.launch_overhead_us does, so a full launch queue never
 * makes a launch wait for the GPU. Prints the median microseconds per launch.
 * libcuda is opened with dlopen, so no CUDA headers or toolkit are needed to build this. */
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef int CUresult;
typedef void *CUcontext, *CUmodule, *CUfunction, *CUstream;
typedef int CUdevice;

static void *sym(void *lib, const char *name) {
    void *f = dlsym(lib, name);
    if (!f) {
        fprintf(stderr, "libcuda has no %s\n", name);
        exit(2);
    }
    return f;
}

#define CHECK(call)                                                  \
    do {                                                             \
        CUresult r_ = (call);                                        \
        if (r_ != 0) {                                               \
            fprintf(stderr, "%s failed: CUresult %d\n", #call, r_);  \
            exit(1);                                                 \
        }                                                            \
    } while (0)

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double now_us(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s kernel.cubin kernel_name [launches]\n", argv[0]);
        return 2;
    }
    int n = argc > 3 ? atoi(argv[3]) : 5000;
    void *lib = dlopen("libcuda.so.1", RTLD_NOW);
    if (!lib) {
        fprintf(stderr, "cannot open libcuda.so.1\n");
        return 2;
    }
    CUresult (*cuInit)(unsigned) = sym(lib, "cuInit");
    CUresult (*cuDeviceGet)(CUdevice *, int) = sym(lib, "cuDeviceGet");
    CUresult (*cuDevicePrimaryCtxRetain)(CUcontext *, CUdevice) =
        sym(lib, "cuDevicePrimaryCtxRetain");
    CUresult (*cuCtxSetCurrent)(CUcontext) = sym(lib, "cuCtxSetCurrent");
    CUresult (*cuModuleLoad)(CUmodule *, const char *) = sym(lib, "cuModuleLoad");
    CUresult (*cuModuleGetFunction)(CUfunction *, CUmodule, const char *) =
        sym(lib, "cuModuleGetFunction");
    CUresult (*cuMemAlloc)(uint64_t *, size_t) = sym(lib, "cuMemAlloc_v2");
    CUresult (*cuCtxSynchronize)(void) = sym(lib, "cuCtxSynchronize");
    CUresult (*cuLaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned,
                               unsigned, unsigned, CUstream, void **, void **) =
        sym(lib, "cuLaunchKernel");

    CUdevice dev;
    CUcontext ctx;
    CUmodule mod;
    CUfunction fn;
    CHECK(cuInit(0));
    CHECK(cuDeviceGet(&dev, 0));
    CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CHECK(cuCtxSetCurrent(ctx));
    CHECK(cuModuleLoad(&mod, argv[1]));
    CHECK(cuModuleGetFunction(&fn, mod, argv[2]));

    _Alignas(64) unsigned char tmap[128];
    memset(tmap, 0, sizeof tmap);
    uint64_t ptr;
    CHECK(cuMemAlloc(&ptr, 1 << 20));
    unsigned count = 7;
    void *params[] = {tmap, &ptr, &count};

    double *t = malloc(sizeof(double) * n);
    for (int i = 0; i < 100; i++) /* warm up */
        CHECK(cuLaunchKernel(fn, 1, 1, 1, 128, 1, 1, 0, 0, params, 0));
    CHECK(cuCtxSynchronize());
    for (int i = 0; i < n; i++) {
        if (i % 50 == 0) CHECK(cuCtxSynchronize());
        double t0 = now_us();
        CHECK(cuLaunchKernel(fn, 1, 1, 1, 128, 1, 1, 0, 0, params, 0));
        t[i] = now_us() - t0;
    }
    CHECK(cuCtxSynchronize());
    qsort(t, n, sizeof(double), cmp);
    printf("%.3f\n", t[n / 2]);
    return 0;
}
