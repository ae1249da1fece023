// Models brought from Python as TorchScript: an nn.Sequential saved with torch.jit.save,
// whose children are the layers.
#pragma once

#include <string>

#include <vector>

#include "absl/status/statusor.h"
#include "runtime/model/layer.h"
#include "runtime/model/model_config.h"

namespace pipetrain::model {

// Every child of the TorchScript module in `path`, in order, as a Layer with trainable
// parameters (whatever the file says). The file is read once through the bounded reader
// (regular files of at most kMaxModelFileBytes, never blocking on a FIFO), then loaded from
// memory. InvalidArgument naming the path for a file that cannot be read or loaded, a child
// without a forward method, or a module without children. Children whose graph draws random
// numbers re-seed the process-wide generator from their LayerContext under a process-wide
// lock, so a recomputed forward replays them even while other stage threads run such layers.
absl::StatusOr<LayerList> LoadTorchScript(const std::string& path);

// The tie groups `tie` names ("A=B[=C...]", each member "child.parameter": a layer of
// `layers`, as LoadTorchScript made them, and a parameter's name in it) by layer and
// parameter position. InvalidArgument listing every violation: a group of fewer than two, a
// name that is no parameter (the layer's names listed), a parameter in two groups or twice in
// one, members of different shapes or different values (the members start equal).
absl::StatusOr<std::vector<TieGroup>> ScriptTieGroups(const LayerList& layers,
                                                      const std::vector<std::string>& tie);

}  // namespace pipetrain::model
