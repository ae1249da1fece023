// The layers of the built-in models (model_config.h: gpt, mlp, cnn, vgg), one at a time.
#pragma once

#include <memory>

#include "runtime/model/layer.h"
#include "runtime/model/model_config.h"

namespace pipetrain::model {

// Built-in layer `i` (0-based, global) of the model `config` describes, its parameters drawn
// in float32 from a generator seeded by LayerInitSeed(config.seed, i) (the calling thread's
// own while it builds); BuildLayers then sets its dtype and mode. REQUIRES: `config` is valid
// and a built-in model, and 0 <= i < BuiltinLayers(config)'s count. LibTorch's errors are
// thrown (c10::Error); BuildLayers catches them. Safe to call from several threads at once.
std::unique_ptr<Layer> BuildBuiltinLayer(const ModelConfig& config, int i);

}  // namespace pipetrain::model
