// Intra-op thread control for a process that runs several pipeline stages at once.
//
// LibTorch's own pool (OpenMP) and OpenBLAS's pthread pool are both process-wide. OpenBLAS
// serializes concurrent calls when its pool has more than one thread, which would make two
// stage threads run one after the other; SetIntraOpThreads(n) sets both pools to n.
// Thread-safe; call it before the stage threads start.
#pragma once

namespace pipetrain {

// Sets LibTorch's intra-op threads and (if OpenBLAS is loaded) OpenBLAS's threads to n >= 1.
void SetIntraOpThreads(int n);

// Number of CPU cores available to this process.
int AvailableCores();

}  // namespace pipetrain
