// Lab only (host_launch_probe.py): cuLaunchKernel in a C loop, to time the driver's own cost of
// a launch apart from Python. Built on the GPU machine:
//   gcc -O2 -shared -fPIC -o launch_loop.so launch_loop.c -ldl
#include <dlfcn.h>
#include <stdint.h>
#include <time.h>

typedef int (*launch_t)(void*, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                        unsigned, void*, void**, void**);

// Launch `fn` `n` times on `stream` with LayerNorm's seven arguments; return the host time per
// launch in microseconds (no synchronization inside the window), or -1 if the driver is missing.
double launch_loop(void* fn, int n, unsigned grid, unsigned block, unsigned smem, void* stream,
                   uint64_t x, uint64_t w, uint64_t b, uint64_t y, int rows, float eps,
                   uint64_t work) {
  void* lib = dlopen("libcuda.so.1", RTLD_NOW);
  if (!lib) return -1.0;
  launch_t launch = (launch_t)dlsym(lib, "cuLaunchKernel");
  if (!launch) return -1.0;
  void* params[7] = {&x, &w, &b, &y, &rows, &eps, &work};
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  for (int i = 0; i < n; ++i) {
    if (launch(fn, grid, 1, 1, block, 1, 1, smem, stream, params, 0) != 0) return -2.0;
  }
  clock_gettime(CLOCK_MONOTONIC, &t1);
  return ((t1.tv_sec - t0.tv_sec) * 1e9 + (t1.tv_nsec - t0.tv_nsec)) / 1e3 / n;
}
