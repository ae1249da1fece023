#include "jobspec/run_summary.h"

#include <nlohmann/json.hpp>

namespace pipetrain::jobspec {
namespace {

template <typename T>
nlohmann::json OrNull(const std::optional<T>& value) {
  return value ? nlohmann::json(*value) : nlohmann::json(nullptr);
}

nlohmann::json Range(const std::pair<int, int>& range) { return {range.first, range.second}; }

nlohmann::json ParsedOrNull(const std::optional<std::string>& json_text) {
  if (!json_text) return nullptr;
  return nlohmann::json::parse(*json_text, nullptr, /*allow_exceptions=*/false);
}

}  // namespace

std::string RunSummaryJson(const RunSummary& s) {
  nlohmann::json j;
  j["launch"] = s.launch;
  j["job_id"] = OrNull(s.job_id);
  j["state"] = s.state;
  j["schedule"] = s.schedule;
  j["stages"] = s.stages;
  j["replicas"] = s.replicas;
  j["microbatches"] = s.microbatches;
  j["microbatch_size"] = s.microbatch_size;
  j["steps"] = s.steps;
  j["model"] = OrNull(s.model);
  j["data"] = OrNull(s.data);
  j["partition"] = nlohmann::json::array();
  for (const auto& range : s.partition) j["partition"].push_back(Range(range));
  j["first_step"] = s.first_step;
  j["losses"] = s.losses;
  j["learning_rates"] = s.learning_rates;
  j["grad_norms"] = s.grad_norms;
  j["evals"] = nlohmann::json::array();
  for (const RunSummary::Eval& e : s.evals) {
    j["evals"].push_back({{"step", e.step}, {"loss", e.loss}, {"accuracy", e.accuracy}});
  }
  j["first_loss"] = s.losses.empty() ? nlohmann::json(nullptr) : nlohmann::json(s.losses.front());
  j["final_loss"] = s.losses.empty() ? nlohmann::json(nullptr) : nlohmann::json(s.losses.back());
  j["skipped_steps"] = s.skipped_steps;
  j["data_entropy"] = OrNull(s.data_entropy);
  j["step_time_s"] = s.step_time_s;
  j["ideal_step_time_s"] = OrNull(s.ideal_step_time_s);
  j["pipeline_efficiency"] = s.ideal_step_time_s && s.step_time_s > 0
                                 ? nlohmann::json(*s.ideal_step_time_s / s.step_time_s)
                                 : nlohmann::json(nullptr);
  j["allreduce_s"] = OrNull(s.allreduce_s);
  j["exposed_allreduce_s"] = OrNull(s.exposed_allreduce_s);
  j["samples_per_s"] = s.samples_per_s;
  j["tokens_per_s"] = OrNull(s.tokens_per_s);
  j["wall_s"] = s.wall_s;
  j["threads_per_stage"] = OrNull(s.threads_per_stage);
  j["per_stage"] = nlohmann::json::array();
  for (const StageSummary& st : s.per_stage) {
    nlohmann::json model_stages = nlohmann::json::array();
    for (const auto& range : st.model_stage_layers) model_stages.push_back(Range(range));
    j["per_stage"].push_back({{"stage", st.stage},
                              {"layers", st.layers ? Range(*st.layers) : nlohmann::json(nullptr)},
                              {"model_stage_layers", model_stages},
                              {"worker", OrNull(st.worker)},
                              {"compute_s", st.compute_s},
                              {"wait_s", st.wait_s},
                              {"allreduce_s", OrNull(st.allreduce_s)},
                              {"peak_stashed_microbatches", OrNull(st.peak_stashed_microbatches)},
                              {"peak_weight_versions", OrNull(st.peak_weight_versions)},
                              {"parameter_bytes", st.parameter_bytes},
                              {"peak_memory_bytes", st.peak_memory_bytes},
                              {"peak_tensor_bytes", st.peak_tensor_bytes},
                              {"bytes_sent", OrNull(st.bytes_sent)}});
  }
  j["plan"] = ParsedOrNull(s.plan_json);
  j["max_param_rel_diff"] = OrNull(s.max_param_rel_diff);
  j["config"] = nlohmann::json::parse(s.config_json, nullptr, /*allow_exceptions=*/false);
  return j.dump(2);
}

std::string PlannedLayoutJson(const v1::PlannedLayout& p) {
  const nlohmann::json j = {
      {"planner", p.planner()},
      {"layout", p.layout()},
      {"workers", p.workers()},
      {"predicted_step_time_s", p.predicted_step_time_s()},
      {"predicted_peak_memory_bytes", std::vector<int64_t>(p.predicted_peak_memory_bytes().begin(),
                                                           p.predicted_peak_memory_bytes().end())},
      {"memory_efficiency", p.memory_efficiency()}};
  return j.dump();
}

}  // namespace pipetrain::jobspec
