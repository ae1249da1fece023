#include "runtime/base/threads.h"

#include <dlfcn.h>
#include <sched.h>

#include <algorithm>
#include <thread>

#include <ATen/Parallel.h>

namespace pipetrain {

void SetIntraOpThreads(int n) {
  n = std::max(1, n);
  at::set_num_threads(n);
  // Looked up at run time so that the build does not depend on which BLAS libtorch uses.
  using SetThreadsFn = void (*)(int);
  if (auto fn = reinterpret_cast<SetThreadsFn>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"))) {
    fn(n);
  }
}

int AvailableCores() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
  return std::max(1u, std::thread::hardware_concurrency());
}

}  // namespace pipetrain
