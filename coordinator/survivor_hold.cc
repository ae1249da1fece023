// See survivor_hold.h.
#include "coordinator/survivor_hold.h"

#include <algorithm>
#include <utility>

namespace pipetrain::coordinator {

SurvivorHold SurvivorHold::FromRound(const SurvivorRound& round,
                                     const std::vector<std::string>& rank_workers, int stages,
                                     std::string key) {
  SurvivorHold hold;
  hold.step = round.plan() ? round.plan()->step : 0;
  hold.key = std::move(key);
  hold.stages = stages;
  for (const auto& [layer, ranks] : round.Holders()) {
    for (int rank : ranks) hold.layer_workers[layer].push_back(rank_workers[rank]);
  }
  for (size_t r = 0; r < rank_workers.size(); ++r) {
    if (round.holds(static_cast<int>(r))) {
      hold.worker_stages[rank_workers[r]] = static_cast<int>(r) % stages;
    }
  }
  return hold;
}

bool SurvivorHold::HeldBy(const std::string& worker_id) const {
  for (const auto& [layer, workers] : layer_workers) {
    if (std::find(workers.begin(), workers.end(), worker_id) != workers.end()) return true;
  }
  return false;
}

SurvivorHold::ForGeneration SurvivorHold::StateFor(
    int64_t start_step, const std::function<std::string(const std::string&)>& live_address) const {
  ForGeneration out;
  if (start_step != step) return out;
  v1::ReplicaState& state = out.state;
  state.set_step(start_step);
  state.set_state_key(key);
  for (const auto& [layer, workers] : layer_workers) {
    v1::ReplicaState::LayerHolders* holders = state.add_layers();
    holders->set_layer(layer);
    for (const std::string& id : workers) {
      if (std::string address = live_address(id); !address.empty()) {
        holders->add_addresses(std::move(address));
      }
    }
    if (holders->addresses_size() == 0) {
      ForGeneration none;
      none.missing_layer = layer;
      return none;
    }
  }
  return out;
}

std::map<std::string, int> SurvivorHold::HolderTurns() const {
  std::map<std::string, int> turn;
  std::map<int, int> holders_of;  // per stage, so far
  for (const auto& [id, stage] : worker_stages) turn[id] = holders_of[stage]++;
  return turn;
}

}  // namespace pipetrain::coordinator
